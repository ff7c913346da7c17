// Monarch configuration: the plain structs a Monarch instance is built from.
//
// A Config is parsed once (from YAML or built in code), validated whole by
// ValidateConfig() and then never changes. Parsing and validation are pure
// functions of their input plus a few read-only file-system checks (paths
// exist, capacities fit the device); they are safe to call from any thread.
//
// The YAML schema is documented in config/README.md; every key below maps to
// one YAML key of the same name.

#ifndef MONARCH_CONFIG_H_
#define MONARCH_CONFIG_H_

#include <cstdint>
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

const char* TierKindName(TierKind kind);

// How a posix tier writes its copies.
enum class WriteMode {
  // Through the page cache while the copies written so far fit in half the
  // memory that was available at start-up (less the RAM tiers); after that,
  // files of 1 MiB and more with O_DIRECT.
  kAuto,
  kBuffered,  // Always through the page cache.
  kDirect,    // O_DIRECT for files of 1 MiB and more (smaller ones are buffered).
};

struct TierConfig {
  std::string name;  // Unique; shows up in stats. Defaults to the kind.
  TierKind kind = TierKind::kRam;
  std::string path;             // pmem/posix: directory holding the copies. Unused otherwise.
  uint64_t capacity_bytes = 0;  // ram/pmem/posix: bytes the tier may hold. Unused for source.
  WriteMode write_mode = WriteMode::kAuto;  // posix only.
  // ram only: back the tier with 2 MiB pages where the kernel allows it
  // (transparent_hugepage/shmem_enabled "advise"), so that a process mapping
  // it afresh (a node service's client, a DataLoader worker) takes a page
  // fault per 2 MiB instead of per 4 KiB. A process that keeps its mapping
  // reads it slower: see config/README.md.
  bool huge_pages = false;
};

struct DatasetConfig {
  std::string path;        // The dataset directory on the source (required).
  std::string file_regex;  // Optional: only dataset-relative names fully matching it are served.
  // Threads that walk the dataset at start-up. Each readdir and stat on a
  // PFS is a metadata round trip, so the walk is latency-bound, not CPU-bound.
  int scan_threads = 8;
  // Symlinks to files found by the walk: "follow" serves them wherever they
  // point, as reading the directory directly would; "inside" serves only
  // those whose target lies inside the dataset directory (checked at the
  // walk) and skips the others; "skip" serves none. Symlinked directories
  // are never entered (a link cycle cannot trap the walk).
  std::string symlinks = "follow";
  // Optional: a manifest of the dataset (`monarch manifest` writes one),
  // absolute; "${VAR}" and "$VAR" are expanded. The namespace is then built
  // from it instead of walking the dataset, after checking that it was
  // written for this path, file_regex and symlinks, and that the root and
  // top-level directories have not changed since (one stat each).
  std::string manifest;
};

// The default of PlacementConfig::max_open_files, for a process whose file
// tiers and source together keep `descriptor_caches` caches of descriptors
// (one each): the descriptors this process may open (RLIMIT_NOFILE), less
// headroom for the program itself (an eighth of the limit, and at least
// 1024 descriptors or half of a smaller limit), shared between the caches;
// 4 to 1000000. The first call raises the soft limit to the hard one (what
// any process may do), so the budget is what the process may have, not
// what its shell happened to start it with.
int DefaultMaxOpenFiles(int descriptor_caches = 4);

struct PlacementConfig {
  int threads = 0;                   // Placement threads; 0 = half the cores (at least 1).
  std::string policy = "first-fit";  // "first-fit" (top-down, no eviction) or "none".
  // Staging memory: chunks read from the source and not yet written to a
  // tier. Never exceeded: buffers are reserved against it before a chunk is
  // loaded, and readers write their chunks into the tier themselves once the
  // ones left to the placement threads fill 3/4 of it. 0 = 256 MiB, or 1/16
  // of physical memory if that is less; at least one chunk.
  uint64_t max_staging_bytes = 0;
  // Granularity at which reads share the bytes a promotion is fetching, and
  // at which it streams them into the tier. A multiple of 4 KiB.
  uint64_t chunk_bytes = 1 << 20;
  // Upper bound on file descriptors (and pmem mappings) each file-backed tier
  // and the source keep open between reads; the total stays bounded whatever
  // the number of files and readers. A copy whose descriptor was closed
  // costs an open and an fstat to read again (its checksums and checked
  // blocks are kept apart, src/drivers/copy_integrity.h), so the budget
  // should hold the files read in an epoch when the limit allows. Default:
  // derived from RLIMIT_NOFILE; built in code, for up to four caches (the
  // source and three file tiers); ParseConfigString and DefaultConfig count
  // the config's own. At most the soft RLIMIT_NOFILE; pmem tiers also keep
  // at most a quarter of vm.max_map_count mappings.
  int max_open_files = DefaultMaxOpenFiles();
  // When pmem and posix tiers check their copies' block checksums
  // (src/drivers/copy_integrity.h): "first-read" (each 4 KiB block the first
  // time a process reads it, plus an fstat per read that catches a copy
  // modified since), "every-read", or "off" (start-up identity check only).
  std::string verify = "first-read";
  // How long Shutdown(kDrain) lets the promotions in flight finish before
  // it cancels the rest. Whatever mode, a shutdown then waits at most a few
  // seconds more for threads inside a read or write (each a chunk long);
  // one blocked in a file system that stopped answering is logged and left
  // behind, so a process always exits (common/shutdown.h).
  double shutdown_timeout_seconds = 30;
};

// Peers: other Monarch processes of the same job, each with its own tiers,
// that serve each other's misses over UCX (src/remote/DESIGN.md). Every file
// has a home peer; a file no local tier holds is asked of its home before
// the source.
struct RemoteConfig {
  bool enabled = false;
  // This process's rank (0..size-1) and the number of peers: an integer,
  // "env:NAME" (read that variable), or "auto" (the launcher's variables:
  // Slurm, Flux, Open MPI, PMI, PMIx, or MONARCH_RANK / MONARCH_SIZE).
  std::string rank = "auto";
  std::string size = "auto";
  // How peers exchange their UCX addresses: "directory" (files in
  // rendezvous_dir, on a file system every peer sees) or "mpi" (an
  // allgather; only in builds with MONARCH_WITH_MPI).
  std::string bootstrap = "directory";
  // Absolute; "${VAR}" and "$VAR" are expanded, e.g. /scratch/rdv/${SLURM_JOB_ID}.
  // Use one directory per job: files of earlier jobs are not told apart.
  std::string rendezvous_dir;
  double rendezvous_timeout_seconds = 60;
  // UCX transports (UCX_TLS syntax), e.g. "tcp", "rc,ud,sm", "all".
  std::string transports = "tcp";
  // Bytes of each pre-registered receive buffer; 0 = "auto", from the
  // dataset's 95th-percentile file size. Larger transfers stream through a
  // buffer in chunk_bytes pieces.
  uint64_t buffer_bytes = 0;
  uint64_t chunk_bytes = 1 << 20;
  // A peer that has not answered within this time is marked down and the
  // read goes to the source; it is tried again after retry_after_seconds.
  double request_timeout_seconds = 10;
  double retry_after_seconds = 30;
  // How many peers keep each file: its home and the next replicas - 1 ranks
  // of its rendezvous order. With 2, losing one peer costs no source reads:
  // the second copy is fetched from the home in the background.
  static constexpr int kMaxReplicas = 8;
  int replicas = 1;
};

// One Monarch service per node (src/service/DESIGN.md): with `shared` on,
// every process of the node that opens this config becomes a thin client of
// the node's service, which owns the namespace, the tiers, placement and the
// peers. Off (or no `node:` section): each process runs Monarch in process.
struct NodeConfig {
  bool shared = false;
  // Holds the service's socket, lock and log. Created 0700. Empty = one
  // service per job and dataset (NodeRuntimeDirectory). "${VAR}" and "$VAR"
  // are expanded.
  std::string runtime_dir;
  // A client that finds no service running starts one ("monarch serve"),
  // detached, and connects to it.
  bool autostart = true;
  // The service exits this long after its last client disconnected; 0 =
  // never (a service started by hand or by a Slurm prolog).
  double idle_exit_seconds = 300;
  // A client whose request the service has not answered within this time
  // (a service stopped or stuck) reads the source itself and treats the
  // service as gone until it answers again. A miss is one source read of at
  // most 8 MiB, so the default leaves a PFS under heavy load ample time.
  double request_timeout_seconds = 60;
  // How long a client waits for a service that is starting (walking the
  // dataset, which on a large one over a PFS takes minutes) before it fails.
  double start_timeout_seconds = 600;
  // Prometheus text at http://127.0.0.1:<port>/metrics; 0 = no endpoint.
  int metrics_port = 0;
};

// The path dataset.manifest names, variables expanded (not checked for
// existence). InvalidArgument naming dataset.manifest for an unset
// variable or a relative result.
absl::StatusOr<std::string> DatasetManifestPath(const DatasetConfig& dataset);

// Clairvoyant prefetch: when a front end announces the order in which files
// will be read (Monarch::AnnounceOrder), background streams read ahead of
// the readers in that order and promote the files as they go.
struct PrefetchConfig {
  // Files fetched at once. A reader's own miss takes one of them while it
  // lasts (at least one stream keeps going). 8 matches Lustre's default
  // max_rpcs_in_flight. 0: no read-ahead; an announced order then only
  // tells eviction what is read next (placement.policy lru).
  int streams = 8;
  // How far ahead of the readers, in bytes of files fetched and not yet read.
  uint64_t lookahead_bytes = 1ull << 30;
};

struct LoggingConfig {
  std::string level = "warning";  // "debug", "info", "warning" or "error".
};

struct Config {
  DatasetConfig dataset;
  std::vector<TierConfig> tiers;  // Fastest first; exactly one source, last.
  PlacementConfig placement;
  PrefetchConfig prefetch;
  RemoteConfig remote;
  NodeConfig node;
  LoggingConfig logging;
};

// The runtime directory of `config`'s node service (not created): the
// expanded node.runtime_dir, or by default <base>/[<job>-]<dataset key>,
// where <base> is $XDG_RUNTIME_DIR/monarch (or /tmp/monarch-<uid> without
// it), <job> is BatchJobTag() and <dataset key> DatasetKey(): so two jobs on
// one node, or two datasets of one user, each get their own service with no
// key to set. InvalidArgument naming node.runtime_dir for an unset
// variable or a relative result.
absl::StatusOr<std::string> NodeRuntimeDirectory(const Config& config);

// What tells datasets apart: 16 hex digits hashed from the dataset
// directory's real path, file_regex, symlinks and manifest. Stable across
// processes and builds.
std::string DatasetKey(const DatasetConfig& dataset);

// The batch job this process belongs to, as part of a directory name:
// "slurm-<SLURM_JOB_ID>" (or pbs-, lsf-, flux- from PBS_JOBID, LSB_JOBID,
// FLUX_JOB_ID); empty outside a job.
std::string BatchJobTag();

// Parses YAML text / a YAML file into a Config and validates it. Errors are
// InvalidArgument (or NotFound for a missing config file) with one message
// that names the offending key, e.g. "tiers[1].capacity: expected a size
// such as 64GiB or 1048576, got '12 parsecs'".
absl::StatusOr<Config> ParseConfigString(std::string_view yaml);
absl::StatusOr<Config> ParseConfigFile(const std::string& path);

// Checks a Config built in code the same way the parser does: paths exist,
// exactly one source and it is last, names unique, capacities non-zero and no
// larger than the device (or physical memory for ram).
absl::Status ValidateConfig(const Config& config);

// The embedded default: a RAM tier sized to half of the memory currently
// available, then the source at `dataset_dir`.
Config DefaultConfig(const std::string& dataset_dir);

// Parses "64GiB", "1.5 GB", "512k", "1048576" into bytes. Binary (KiB, MiB..)
// and decimal (KB, MB..) suffixes; a bare K/M/G/T means binary.
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);

}  // namespace monarch

#endif  // MONARCH_CONFIG_H_
