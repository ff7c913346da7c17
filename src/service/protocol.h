// The node service's wire protocol: framed binary messages on a Unix socket.
//
// A frame is a 12-byte header (magic, type, payload length) and a payload
// of fixed-width integers and length-prefixed strings, in the host's byte
// order (both ends are on one node). Descriptors travel beside a frame as
// SCM_RIGHTS. Every decoder is total: a truncated, oversized or otherwise
// malformed payload yields InvalidArgument, never a crash or an unbounded
// allocation (tests/fuzz/fuzz_service_protocol.cc fuzzes them).
//
// Conversation: the client sends Hello and gets HelloReply with the shared
// regions' descriptors; then any number of requests, each answered in order
// by one reply (Stage by a stream of StageProgress ending in one marked
// finished) or by an Error.

#ifndef MONARCH_SERVICE_PROTOCOL_H_
#define MONARCH_SERVICE_PROTOCOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/counters.h"
#include "drivers/storage_driver.h"  // SourceIdentity.
#include "metadata/namespace.h"        // FileRange.
#include "monarch/stats.h"

namespace monarch::service {

constexpr uint32_t kFrameMagic = 0x4d4f4e31;  // "MON1"
// 2: kAnnounce, kConsumed. 3: huge_pages. 4: the dataset key in Hello and StatusReply.
// 5: ClientCounters holds a TierReads per tier. 6: kAnnounce may carry ranges;
// kReadAhead; extents in the namespace image (read by clients).
// 7: kCheckedCopies (a client maps copies the service checked).
// 8: the job in Hello, the cache shape in HelloReply, jobs in StatusReply and StatsReply.
// 9: guests (node.share_with_group): HelloReply::guest, kProveAccess.
constexpr uint32_t kProtocolVersion = 9;
constexpr size_t kFrameHeaderBytes = 12;
constexpr uint32_t kMaxPayloadBytes = 4u << 20;  // Stats of many tiers, stage lists.
constexpr size_t kMaxStringBytes = 1u << 20;
constexpr size_t kMaxDescriptors = 200;  // Below the kernel's SCM_MAX_FD (253).

enum class MessageType : uint16_t {
  kHello = 1,
  kHelloReply = 2,
  kRead = 3,
  kReadReply = 4,
  kStats = 5,
  kStatsReply = 6,
  kStage = 7,
  kStageProgress = 8,
  kStop = 9,
  kStatus = 10,
  kStatusReply = 11,
  kOk = 12,
  kError = 13,
  kWaitForPlacement = 14,  // Answered with kOk once no promotion is in flight.
  kAnnounce = 15,          // A piece of the client's read order; each answered with kOk.
  kConsumed = 16,          // Files the client started reading; not answered.
  kReadAhead = 17,         // A client's scan of a file cached by extents; not answered.
  kCheckedCopies = 18,     // Which copies may be mapped; answered with kCheckedCopiesReply.
  kCheckedCopiesReply = 19,
  kProveAccess = 20,  // A guest's proof it may read a file; answered with kOk or an Error.
};

struct FrameHeader {
  MessageType type = MessageType::kError;
  uint32_t length = 0;
};
void EncodeFrameHeader(MessageType type, uint32_t length, char out[kFrameHeaderBytes]);
absl::StatusOr<FrameHeader> DecodeFrameHeader(const char in[kFrameHeaderBytes]);

// The first page of each connection's transfer buffer: the client process's
// own counters (reads it served itself from tier copies), which the service
// adds to the node's for `monarch stats`. Shared memory: atomics only.
constexpr int kMaxSharedTiers = 20;  // 16 configured + peers + source, rounded up.
struct ClientCounters {
  std::atomic<uint64_t> source_fallbacks;  // Reads served from the source while the service was down.
  TierReads tiers[kMaxSharedTiers];        // Hits, by tier index.
};
constexpr uint64_t kCountersPageBytes = 4096;
static_assert(sizeof(ClientCounters) <= kCountersPageBytes);

// --- Messages. Each has Encode (payload bytes) and Decode (from payload).

struct Hello {
  uint32_t version = kProtocolVersion;
  std::string dataset_root;  // The client's dataset; must match the service's.
  // DatasetKey() of the client's config (version 4 on; encoded only then, so
  // that an older client is answered with the version mismatch).
  std::string dataset_key;
  // The job the client process belongs to (ThisJobName()), version 8 on:
  // the service counts each job's processes and reads.
  std::string job;
};

// One tier as the service has it. `descriptors` of them follow in the
// frame's SCM_RIGHTS, after the fixed ones (HelloReply::kFixedDescriptors).
struct TierDescription {
  uint32_t kind = 0;  // TierKind.
  std::string name;
  std::string path;
  uint32_t descriptors = 0;
  bool huge_pages = false;  // A RAM tier of 2 MiB pages, asked for or its tmpfs's.
};

struct HelloReply {
  // Descriptors before the tiers': the namespace image, the tier slots, and
  // this connection's transfer buffer.
  static constexpr uint32_t kFixedDescriptors = 3;
  uint64_t instance_id = 0;  // Random per service start: tells restarts apart.
  uint32_t service_pid = 0;
  uint32_t file_count = 0;
  uint32_t max_open_files = 0;
  uint64_t buffer_bytes = 0;  // Of the transfer buffer (after its counters page).
  std::string dataset_root;
  std::vector<TierDescription> tiers;
  // CacheShape() of the service's config: a client whose config caches
  // differently says so (both named one node.runtime_dir).
  std::string cache_shape;
  // The client is another user (node.share_with_group): it gets no tier's
  // descriptors (every tier has none), maps no copy and opens none, and
  // reads every byte through the service, each file after kProveAccess.
  bool guest = false;
  uint32_t TotalDescriptors() const;
};

struct ReadRequest {
  uint32_t file_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;  // At most HelloReply::buffer_bytes.
};
struct ReadReply {
  uint64_t bytes = 0;  // In the transfer buffer.
};

// A guest's proof that it may read file `file_id`: one descriptor beside
// the frame, the file opened on the source by the guest itself. The
// service grants the file to the guest's process if the descriptor is
// open for reading (not O_PATH) and is that file (device and inode);
// the kernel, the file system and its ACLs judged the open, not Monarch.
struct ProveAccessRequest {
  uint32_t file_id = 0;
};

struct ErrorReply {
  uint32_t code = 0;  // absl::StatusCode.
  std::string message;
  absl::Status ToStatus() const;
  static ErrorReply From(const absl::Status& status);
};

// One client process as the service sees it.
struct ClientStats {
  uint32_t pid = 0;
  uint32_t connections = 0;
  uint64_t hits = 0;        // Reads it served itself from tier copies.
  uint64_t hit_bytes = 0;
  uint64_t misses = 0;      // Reads the service served for it.
  uint64_t miss_bytes = 0;
};
// One job (Hello::job) the service serves or served: its processes' reads.
struct JobStats {
  std::string name;
  uint32_t processes = 0;   // Client processes connected now; 0: the job left.
  uint64_t hits = 0;        // Reads its processes served themselves.
  uint64_t hit_bytes = 0;
  uint64_t misses = 0;      // Reads the service served it.
  uint64_t miss_bytes = 0;
  // Of miss_bytes, those the service read from the source for it: what it
  // waited on the PFS for. Prefetch streams' reads are the node's, no job's.
  uint64_t source_bytes = 0;
};
struct StatsReply {
  Stats node;  // The node's counters, clients' own hits included per tier.
  std::vector<ClientStats> clients;
  std::vector<JobStats> jobs;  // Attached ones first, then those that left.
};

// A client's read order for prefetch (Monarch::AnnounceOrder), sent in
// pieces of at most kMaxIdsPerMessage file ids, or (AnnounceRanges) of at
// most kMaxRangesPerMessage ranges. An order is one or the other: its first
// piece says which, and a piece of the other kind is refused.
struct AnnounceRequest {
  bool first = true;  // Starts a new order: drops pieces sent before.
  bool last = true;   // The order is complete: the service announces it.
  std::vector<uint32_t> file_ids;
  bool ranges = false;  // This piece holds `samples`, not `file_ids`.
  std::vector<FileRange> samples;  // Monarch::SampleRange, by file id.
};
// Files a client started reading (hits included, which the service does not
// see otherwise): they free the prefetch lookahead.
struct ConsumedNotice {
  std::vector<uint32_t> file_ids;
};
// A client scanning a file cached by extents reached `end` (its hits never
// reach the service, which would otherwise see no scan): the service reads
// the next extents ahead (PlacementHandler::ReadAheadPast).
struct ReadAheadNotice {
  uint32_t file_id = 0;
  uint64_t end = 0;
};
// A client mapping a file (Monarch::MapCopies) asks which of the copies its
// pieces (files or extents, by entry id) are in the service checked whole:
// a page fault checks nothing, so only those may be mapped. The reply
// lists those, with the copy's inode as the service checked it, which the
// client's own fstat() of the copy must match (CopyMapping::MarkMapped,
// OpenCheckedCopy). The others are queued to be checked. A RAM copy needs
// no check; the service's yes (with the file's own identity as the stamp)
// means it holds that file's copies, once removed, until no process maps
// them, and the client maps the copy where its slot says it lies. (A
// service from before RAM copies were mapped says no to them.)
struct CheckedCopiesRequest {
  std::vector<uint32_t> ids;
};
struct CheckedCopyStamp {
  uint32_t id = 0;
  SourceIdentity copy;  // The copy's inode (CopyState::Stamp), not the source's.
};
struct CheckedCopiesReply {
  std::vector<CheckedCopyStamp> copies;
};
constexpr size_t kMaxIdsPerMessage = (kMaxPayloadBytes - 16) / 4;
// Ids per request: as many stamps as a reply holds.
constexpr size_t kMaxCheckedCopiesPerMessage = (kMaxPayloadBytes - 16) / 44;
constexpr size_t kMaxRangesPerMessage = (kMaxPayloadBytes - 16) / 20;

struct StageRequest {
  std::vector<std::string> globs;  // Empty: the whole dataset.
};
struct StageProgress {
  uint64_t files_total = 0;
  uint64_t bytes_total = 0;
  uint64_t files_done = 0;   // In a tier, or given up (no room).
  uint64_t bytes_done = 0;
  uint64_t files_in_tiers = 0;
  uint32_t finished = 0;
};

struct StatusReply {
  uint32_t service_pid = 0;
  double uptime_seconds = 0;
  std::string dataset_root;
  uint32_t clients = 0;
  uint64_t files = 0;
  uint64_t dataset_bytes = 0;
  uint64_t files_in_tiers = 0;
  uint64_t bytes_in_tiers = 0;
  std::string dataset_key;  // DatasetKey() of the config the service runs.
  std::string cache_shape;  // CacheShape() of that config.
  uint64_t source_bytes = 0;  // Read from the source since the service started.
  std::vector<JobStats> jobs;  // As in StatsReply.
};

std::string Encode(const Hello& m);
std::string Encode(const HelloReply& m);
std::string Encode(const ReadRequest& m);
std::string Encode(const ReadReply& m);
std::string Encode(const ProveAccessRequest& m);
std::string Encode(const ErrorReply& m);
std::string Encode(const StatsReply& m);
std::string Encode(const StageRequest& m);
std::string Encode(const AnnounceRequest& m);
std::string Encode(const ConsumedNotice& m);
std::string Encode(const ReadAheadNotice& m);
std::string Encode(const CheckedCopiesRequest& m);
std::string Encode(const CheckedCopiesReply& m);
std::string Encode(const StageProgress& m);
std::string Encode(const StatusReply& m);

absl::StatusOr<Hello> DecodeHello(absl::string_view payload);
absl::StatusOr<HelloReply> DecodeHelloReply(absl::string_view payload);
absl::StatusOr<ReadRequest> DecodeReadRequest(absl::string_view payload);
absl::StatusOr<ReadReply> DecodeReadReply(absl::string_view payload);
absl::StatusOr<ProveAccessRequest> DecodeProveAccessRequest(absl::string_view payload);
absl::StatusOr<ErrorReply> DecodeErrorReply(absl::string_view payload);
absl::StatusOr<StatsReply> DecodeStatsReply(absl::string_view payload);
absl::StatusOr<StageRequest> DecodeStageRequest(absl::string_view payload);
absl::StatusOr<AnnounceRequest> DecodeAnnounceRequest(absl::string_view payload);
absl::StatusOr<ConsumedNotice> DecodeConsumedNotice(absl::string_view payload);
absl::StatusOr<ReadAheadNotice> DecodeReadAheadNotice(absl::string_view payload);
absl::StatusOr<CheckedCopiesRequest> DecodeCheckedCopiesRequest(absl::string_view payload);
absl::StatusOr<CheckedCopiesReply> DecodeCheckedCopiesReply(absl::string_view payload);
absl::StatusOr<StageProgress> DecodeStageProgress(absl::string_view payload);
absl::StatusOr<StatusReply> DecodeStatusReply(absl::string_view payload);

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_PROTOCOL_H_
