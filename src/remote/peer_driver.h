// PeerDriver: the peers tier. Sits between the cache tiers and the source.
//
// Every dataset file has an order of ranks (rendezvous hashing over the
// peers): its home first, then the ranks that take it over when the ones
// before them are lost. The first `remote.replicas` ranks of the order keep
// the file. A read of a file no cache tier holds asks the peers tier first:
// it fetches the file from the first rank of its order that is not marked
// down, moving down the order when that rank turns out to be dead; when that
// rank is this process it answers NotFound and the read goes on to the
// source, as it does when a live home fails to deliver. A holder serves
// requests through its own read path, so it reads each file from the PFS
// once (concurrent requests share one promotion) and keeps it.
//
// A keeper thread fills what this process should keep but does not hold:
// at start its replicas (fetched from the home), and when a peer fails the
// files of that peer that now fall to this process (re-homing: each is
// read from the PFS once, by its new holder, and only that peer's files
// move). A peer that leaves cleanly is not adopted ahead of reads.
//
// Read-only: NewWriter and Remove are refused, like the source's.
//
// Lifecycle: Create() (resolves rank and size, assigns homes), then the
// instance puts it in its tier list and builds its placement handler, then
// Connect() (meets the peers and starts serving: requests arrive from then
// on), Shutdown() before the placement handler goes away.

#ifndef MONARCH_REMOTE_PEER_DRIVER_H_
#define MONARCH_REMOTE_PEER_DRIVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/counters.h"
#include "drivers/storage_driver.h"
#include "metadata/namespace.h"
#include "monarch/config.h"
#include "placement/placement_policy.h"
#include "remote/peer_network.h"
#include "remote/rendezvous_hash.h"

namespace monarch {

class PeerKeeper;

class PeerDriver final : public StorageDriver {
 public:
  static absl::StatusOr<std::unique_ptr<PeerDriver>> Create(const RemoteConfig& config,
                                                            const Namespace* ns);
  ~PeerDriver() override;

  // Promotes a file into this process's tiers through its read path.
  using FillFn = std::function<void(uint32_t file_id)>;

  // Meets the peers (blocks until all have arrived or the rendezvous times
  // out), serves their requests with `serve` from then on, and starts the
  // keeper, which calls `fill` for the files to keep.
  absl::Status Connect(PeerNetwork::ServeFn serve, FillFn fill);
  // Peer fetches fail from now on, and those waiting give up at once (reads
  // go to the source): shutdown has started. Peers are still served.
  void CancelFetches();
  // Stops the keeper (waiting until `deadline` for a fill it is in) and the
  // network (PeerNetwork::Shutdown), and withdraws from the rendezvous
  // directory. False if a thread was still inside a read then: the driver
  // must be abandoned, not destroyed. Idempotent.
  bool Shutdown(Deadline deadline);

  // Blocks until the keeper has no file left to fill (part of
  // WaitForPlacement: replicas and re-homed files are placement work), or
  // StopFilling() was called. Each fill is a promotion, which ends.
  void WaitForFills();
  // The keeper starts no more fills (first thing at shutdown; Shutdown()
  // waits for one in progress). Idempotent.
  void StopFilling();

  // StorageDriver. Read: the bytes from the first rank of the file's order
  // not marked down, or NotFound when that is this process (or it is alone),
  // or the error of a live rank that failed to deliver.
  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n) override;
  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) override;
  absl::Status Remove(const FileRef& file) override;

  // OK if `file` may be served to a peer by this process: we come before the
  // requester in the file's order (so requests only move toward its home and
  // cannot loop), and the peer's view of it (size, mtime) is ours.
  absl::Status CheckServable(const FileEntry* entry, const PeerNetwork::FileRequest& request) const;

  // Whether this process is, now, one of the first `replicas` ranks of the
  // file's order that are not lost.
  bool IsKept(uint32_t id) const;

  // The files this process is home of, for the placement policy: they get
  // room before copies of files homed elsewhere (DYAD-style inclusive
  // copies), which would otherwise crowd out the share the peers rely on it
  // to keep. Call after the warm-restart scan: files already in a tier are
  // not pending.
  KeptShare HomeShare() const;

  void ReportCounters(CounterSink& sink) const;

 private:
  friend class PeerKeeper;  // Asks who keeps a file and who is alive.

  PeerDriver(const RemoteConfig& config, const Namespace* ns, int rank, int size);

  // Whether a read may ask `rank` now (a peer marked down is tried again
  // after remote.retry_after).
  bool Up(int rank) const { return rank == rank_ || network_ == nullptr || network_->IsUp(rank); }
  // Whether `rank` counts as holding its files: not lost since it last
  // answered (unlike Up, not reset by the retry time: who keeps a file does
  // not flip back and forth while a dead peer is retried).
  bool Alive(int rank) const {
    return rank == rank_ || network_ == nullptr || !network_->IsLost(rank);
  }
  // IsKept, with `alive(rank)` saying which ranks count.
  template <typename AliveFn>
  bool KeptGiven(uint32_t id, AliveFn alive) const;
  // The order in which the ranks hold entry `id` (a file or an extent).
  HolderOrder OrderOf(uint32_t id) const;
  // The first replicas_ ranks of `id`'s order, fixed at start.
  const uint16_t* Holders(uint32_t id) const { return &holders_[size_t{id} * replicas_]; }
  // The rank a read of `id` asks: the first of its order not marked down
  // (this process, when every rank before it is down).
  int FirstUpHolder(uint32_t id) const;

  const RemoteConfig config_;
  const Namespace* const ns_;
  const int rank_;
  const int size_;
  const int replicas_;             // min(remote.replicas, size)
  std::vector<uint16_t> holders_;  // replicas_ per file id.
  uint64_t home_files_ = 0;
  uint64_t replica_files_ = 0;
  uint64_t buffer_bytes_ = 0;
  std::unique_ptr<PeerNetwork> network_;  // Null until Connect() (and when alone).
  std::string rendezvous_dir_;            // Expanded; empty with MPI.

  const std::unique_ptr<PeerKeeper> keeper_;  // Its thread starts once connected.

  std::atomic<uint64_t> fallbacks_{0};
  std::atomic<uint64_t> rehomed_fetches_{0};
  std::atomic<uint64_t> down_skips_{0};
  std::atomic<uint64_t> wait_ns_{0};
};

}  // namespace monarch

#endif  // MONARCH_REMOTE_PEER_DRIVER_H_
