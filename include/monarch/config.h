// Monarch configuration: the plain structs a Monarch instance is built from.
//
// A Config is parsed once (from YAML or built in code), validated whole by
// ValidateConfig() and then never changes. Parsing and validation are pure
// functions of their input plus a few read-only file-system checks (paths
// exist, capacities fit the device); they are safe to call from any thread.
//
// Every field maps to the YAML key of the same name (sizes and durations
// carry a unit suffix in the name here: `chunk_bytes`, `..._seconds`). What
// each key does, its values and its default: config/README.md, generated
// from the table of keys (src/config/config_keys.cc), which also drives the
// parser and the range checks. The comments below only say what a field
// holds.

#ifndef MONARCH_CONFIG_H_
#define MONARCH_CONFIG_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace monarch {

// What kind of storage a tier is. Tiers are ordered fastest first; the last
// one is always the read-only source (the parallel file system).
enum class TierKind {
  kRam,     // Process memory.
  kPmem,    // Persistent memory through libpmem (files mapped on a DAX path).
  kPosix,   // A local directory (NVMe/SSD) read and written with pread/pwrite.
  kSource,  // The dataset on the PFS. Read-only: Monarch never writes there.
  kPeers,   // Other nodes' tiers over UCX, just before the source. Read-only;
            // added by the `remote:` section, never listed under `tiers:`.
};

// tiers[i].write_mode: how a posix tier writes its copies.
enum class WriteMode {
  kAuto,      // Buffered while the copies fit in the page cache's share, then direct.
  kBuffered,  // Always through the page cache.
  kDirect,    // O_DIRECT for files of 1 MiB and more (smaller ones are buffered).
};

// dataset.symlinks: what the walk does with symlinks to files.
enum class SymlinkPolicy {
  kFollow,  // Serve them, wherever they point.
  kInside,  // Serve those whose target lies inside the root; skip the others.
  kSkip,    // Serve none.
};

// placement.policy: which copies are made, and which go when tiers are full.
enum class PlacementPolicyKind {
  kFirstFit,  // Top-down into the first tier with room; no eviction.
  kLru,       // First-fit, then eviction (CLOCK, or next use with an announced order).
  kNone,      // Never promote.
};

// placement.verify: how file-backed tiers check their copies against the
// checksums written with them (src/drivers/copy_integrity.h).
// What a miss does when the source holds the bytes in memory already (the
// page cache of a local file system or of a PFS client).
enum class CachedSourcePolicy {
  kDefer,    // Serve them from there; copy the file later, on idle CPU.
  kPromote,  // As for any miss: promote the file now, through staging.
};

enum class VerifyPolicy {
  kOff,        // Never: the copy's identity is still checked at start-up.
  kFirstRead,  // Each 4 KiB block the first time this process reads it, and
               // every read checks that the copy was not modified since.
  kEveryRead,  // Every block of every read.
};

// remote.bootstrap: how peers exchange their UCX addresses.
enum class BootstrapKind {
  kDirectory,  // Files in remote.rendezvous_dir.
  kMpi,        // An MPI allgather (builds with MONARCH_WITH_MPI).
};

// logging.level.
enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// The YAML names of the values above ("ram", "first-fit", "warning", ...),
// from one table per enum (src/config/config_keys.cc).
const char* TierKindName(TierKind kind);
const char* NameOf(TierKind value);
const char* NameOf(WriteMode value);
const char* NameOf(SymlinkPolicy value);
const char* NameOf(PlacementPolicyKind value);
const char* NameOf(VerifyPolicy value);
const char* NameOf(CachedSourcePolicy value);
const char* NameOf(BootstrapKind value);
const char* NameOf(LogLevel value);

struct TierConfig {
  std::string name;  // Unique; shows up in stats. Defaults to the kind.
  TierKind kind = TierKind::kRam;
  std::string path;             // pmem/posix: the directory holding the copies.
  uint64_t capacity_bytes = 0;  // ram/pmem/posix: bytes the tier may hold.
  WriteMode write_mode = WriteMode::kAuto;  // posix only.
  bool huge_pages = false;                  // ram only: 2 MiB pages where allowed.
  uint64_t back_ahead_bytes = 256ull << 20;  // ram only: memory allocated ahead of copies.
};

struct DatasetConfig {
  std::string path;        // The dataset directory on the source (required).
  std::string file_regex;  // Only dataset-relative names fully matching it; empty: all.
  int scan_threads = 8;    // Threads that walk the dataset at start-up.
  SymlinkPolicy symlinks = SymlinkPolicy::kFollow;
  std::string manifest;  // A manifest to build the namespace from instead of a walk.
  bool keep_namespace = true;  // A walk's namespace is kept on the node for the next start.
};

// The default of PlacementConfig::max_open_files, for a process whose file
// tiers and source together keep `descriptor_caches` caches of descriptors
// (one each): the descriptors this process may open (RLIMIT_NOFILE's hard
// limit), less headroom for the program itself (an eighth of the limit,
// and at least 1024 descriptors or half of a smaller limit), shared between
// the caches; 4 to 1000000. Changes nothing: an instance (or node service)
// raises the soft limit to the hard one when it starts, what any process
// may do, so the budget is what the process may have, not what its shell
// happened to start it with.
int DefaultMaxOpenFiles(int descriptor_caches = 4);

struct PlacementConfig {
  int threads = 0;  // Placement threads; 0: half the cores (at least 1).
  PlacementPolicyKind policy = PlacementPolicyKind::kFirstFit;
  uint64_t max_staging_bytes = 0;  // 0: 256 MiB, or 1/16 of physical memory if less.
  uint64_t chunk_bytes = 1 << 20;
  // Files larger than extent_threshold are cached by extents of
  // extent_bytes (metadata/namespace.h); 0: whole files only.
  uint64_t extent_bytes = 4ull << 20;
  uint64_t extent_threshold = 256ull << 20;
  // Descriptors (or pmem mappings) each file tier, and the source, keep.
  // Built in code, the default assumes four caches; the parser derives it
  // from the config's own.
  int max_open_files = DefaultMaxOpenFiles();
  VerifyPolicy verify = VerifyPolicy::kFirstRead;
  CachedSourcePolicy cached_source = CachedSourcePolicy::kDefer;
  bool route_by_speed = true;  // A file tier's hit may come from the source's page cache.
  double shutdown_timeout_seconds = 30;  // How long Shutdown(kDrain) drains.
};

// Clairvoyant prefetch from announced read orders (Monarch::AnnounceOrder).
struct PrefetchConfig {
  int streams = 8;  // Files fetched at once; 0: no read-ahead.
  uint64_t lookahead_bytes = 1ull << 30;
  // With no order announced, a node service stages each top-level
  // directory its readers miss in, if the tiers hold it
  // (placement/stage_ahead.h).
  bool stage_ahead = true;
};

// Peers: other Monarch processes of the same job, each with its own tiers,
// that serve each other's misses over UCX (src/remote/DESIGN.md).
struct RemoteConfig {
  bool enabled = false;
  // An integer, "env:NAME" (that variable) or "auto" (the launcher's).
  std::string rank = "auto";
  std::string size = "auto";
  BootstrapKind bootstrap = BootstrapKind::kDirectory;
  std::string rendezvous_dir;  // Absolute; "$VAR" and "${VAR}" are expanded.
  double rendezvous_timeout_seconds = 60;
  std::string transports = "tcp";  // UCX_TLS syntax.
  uint64_t buffer_bytes = 0;       // Each receive buffer; 0: "auto".
  uint64_t chunk_bytes = 1 << 20;
  double request_timeout_seconds = 10;
  double retry_after_seconds = 30;
  static constexpr int kMaxReplicas = 8;
  int replicas = 1;  // Peers that keep each file.
};

// One Monarch service per node (src/service/DESIGN.md).
struct NodeConfig {
  bool shared = false;
  std::string runtime_dir;  // Empty: one per dataset and cache shape (NodeRuntimeDirectory).
  bool autostart = true;
  double idle_exit_seconds = 300;  // 0: never.
  bool keep_ram = true;  // RAM copies outlive a service's restart (drivers/ram_keep.h).
  // The tmpfs that holds a kept RAM tier's files. A mount with huge=always
  // or within_size gives them 2 MiB pages, so a new process maps a copy in
  // one fault per 2 MiB instead of one per 64 KiB. "auto": a private tmpfs
  // of 2 MiB pages held by a keeper process, or /dev/shm where the service
  // is in its batch job's cgroup, which the job's end kills whole
  // (service/ram_keeper.h).
  std::string ram_dir = "auto";
  // A group (name or gid) whose members share this user's service: empty,
  // nobody else. Members read through it as guests (service/DESIGN.md).
  std::string share_with_group;
  double request_timeout_seconds = 60;
  double start_timeout_seconds = 600;
  int metrics_port = 0;  // 0: no endpoint.
};

// A RAM tier that yields to memory pressure (src/placement/memory_governor.h):
// the memory cgroup's limit and usage (v1 or v2), the system's available
// memory and the kernel's PSI triggers are watched, and under pressure the
// RAM tiers shrink, their copies moved down to a file tier or dropped.
struct MemoryConfig {
  bool watch = true;
  uint64_t headroom_bytes = 256ull << 20;  // Kept free below the limit.
  double psi_stall_seconds = 0.15;         // Stall per second that counts as pressure; 0: none.
  double interval_seconds = 0.1;           // Sampling period between events.
  double grow_after_seconds = 30;          // Pressure-free time before growing back.
};

struct LoggingConfig {
  LogLevel level = LogLevel::kWarning;
};

struct Config {
  DatasetConfig dataset;
  std::vector<TierConfig> tiers;  // Fastest first; exactly one source, last.
  PlacementConfig placement;
  PrefetchConfig prefetch;
  RemoteConfig remote;
  NodeConfig node;
  MemoryConfig memory;
  LoggingConfig logging;
};

// The path dataset.manifest names, variables expanded (not checked for
// existence). InvalidArgument naming dataset.manifest for an unset
// variable or a relative result.
absl::StatusOr<std::string> DatasetManifestPath(const DatasetConfig& dataset);

// The runtime directory of `config`'s node service (not created): the
// expanded node.runtime_dir, or by default <base>/<dataset key>-<shape key>,
// where <base> is $XDG_RUNTIME_DIR/monarch (or /tmp/monarch-<uid> without
// it), <dataset key> is DatasetKey() and <shape key> CacheShapeKey(): so
// every job of a user that reads one dataset through the same tiers meets
// in one service, with no key to set, while two datasets, two users, or two
// configs that cache differently each get their own. InvalidArgument
// naming node.runtime_dir for an unset variable or a relative result.
// With node.share_with_group, <base> is /tmp/monarch-group-<gid> instead,
// one for all the group's members.
absl::StatusOr<std::string> NodeRuntimeDirectory(const Config& config);

// The group node.share_with_group names (a name, or a number), or nullopt
// when it is empty. InvalidArgument naming the key when no such group exists.
absl::StatusOr<std::optional<gid_t>> NodeShareGroup(const NodeConfig& node);

// Where a walk's namespace is kept on this node for the next start
// (dataset.keep_namespace): <base>/namespaces/<dataset key>.manifest, <base>
// as in NodeRuntimeDirectory, so per user and shared by the user's jobs.
std::string KeptNamespacePath(const DatasetConfig& dataset);

// What tells datasets apart: 16 hex digits hashed from the dataset
// directory's path (as written, less empty and "." components),
// file_regex, symlinks and manifest. Stable across processes and builds.
std::string DatasetKey(const DatasetConfig& dataset);

// What a config caches, for people: its tiers but the source, each as
// kind, path, capacity in bytes and huge_pages, e.g. "ram 8589934592 B,
// posix /nvme/cache 107374182400 B".
std::string CacheShape(const Config& config);
// CacheShape() hashed to 8 hex digits: configs with one shape share a
// service (NodeRuntimeDirectory).
std::string CacheShapeKey(const Config& config);

// The batch job this process belongs to by its environment: the scheduler
// ("slurm", "pbs", "lsf", "flux") and the id from SLURM_JOB_ID, PBS_JOBID,
// LSB_JOBID or FLUX_JOB_ID, the first one set; empty outside a job.
struct BatchJob {
  std::string scheduler;
  std::string id;
};
BatchJob ThisBatchJob();
// The same as part of a directory name:
// "slurm-<SLURM_JOB_ID>" (or pbs-, lsf-, flux- from PBS_JOBID, LSB_JOBID,
// FLUX_JOB_ID); empty outside a job.
std::string BatchJobTag();

// Parses YAML text / a YAML file into a Config and validates it. Errors are
// InvalidArgument (or NotFound for a missing config file) with one message
// that names the offending key, e.g. "tiers[1].capacity: expected a size
// such as 64GiB or 1048576, got '12 parsecs'".
absl::StatusOr<Config> ParseConfigString(std::string_view yaml);
absl::StatusOr<Config> ParseConfigFile(const std::string& path);

// Checks a Config built in code the same way the parser does: every key's
// range, paths exist, exactly one source and it is last, names unique,
// capacities non-zero and no larger than the device (or physical memory
// for ram).
absl::Status ValidateConfig(const Config& config);

// The embedded default: a RAM tier sized to half of the memory currently
// available, then the source at `dataset_dir`.
Config DefaultConfig(const std::string& dataset_dir);

// Parses "64GiB", "1.5 GB", "512k", "1048576" into bytes. Binary (KiB, MiB..)
// and decimal (KB, MB..) suffixes; a bare K/M/G/T means binary.
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);

}  // namespace monarch

#endif  // MONARCH_CONFIG_H_
