// Which parts of some files the processes of this node map privately.
//
// A RAM tier hands out its copies to be mapped in place (Monarch::MapCopies).
// A removed copy's memory may then be reused only when no process maps it
// any more: not the one that asked, not a child it forked, whether they
// unmapped it, remapped over it or died. The kernel's page tables are the
// only record of that which no process can forget to update, so the tier
// asks them, through /proc/<pid>/maps, instead of keeping pins a process
// would have to give back.
//
// Only private mappings are reported: a RAM tier's own mappings of its
// memory, and its clients' for reading, are shared ones, and Monarch maps
// copies in place privately. A VMA is reported with the file offsets it
// covers, split or merged however the kernel keeps it.

#ifndef MONARCH_COMMON_PROCESS_MAPPINGS_H_
#define MONARCH_COMMON_PROCESS_MAPPINGS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"

namespace monarch {

// A file as /proc/<pid>/maps names it: st_dev and st_ino.
struct MappedFileKey {
  uint64_t device = 0;
  uint64_t inode = 0;
  bool operator==(const MappedFileKey& other) const {
    return device == other.device && inode == other.inode;
  }
};

// [begin, end) of a file's bytes that some process maps privately.
struct MappedFileRange {
  MappedFileKey file;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Private mappings of `files` in every process under `proc` (a procfs
// mount), this one included. A process whose maps cannot be read (one of
// another user; one made non-dumpable; in a container, one with
// capabilities this one lacks, such as its init) is skipped if it runs as
// another user, or started before `since` (CLOCK_BOOTTIME, in nanoseconds:
// when the files' memory was first handed out to be mapped), since it
// could not have been handed any. Any other makes the walk inconclusive:
// FailedPrecondition, naming it, as it might map any of them.
absl::StatusOr<std::vector<MappedFileRange>> FindPrivateMappings(
    const std::vector<MappedFileKey>& files, int64_t since, const std::string& proc = "/proc");

// Now on CLOCK_BOOTTIME, in nanoseconds: the clock of FindPrivateMappings'
// `since`, and of the start times in /proc/<pid>/stat.
int64_t BootTimeNanos();

// Mappings one cache of them keeps at most (a pmem tier's, the source's
// for telling what is in memory): a quarter of vm.max_map_count (65530 by
// default), which the process's libraries, heap, thread stacks and RAM
// tiers share.
int MappingBudget();

// One line of /proc/<pid>/maps, if it is a private mapping of one of
// `files`; for FindPrivateMappings and its tests.
bool ParsePrivateMapping(absl::string_view line, const std::vector<MappedFileKey>& files,
                         MappedFileRange* range);

// A walk of every process's private mappings of `files`, whose memory was
// first handed out at `since` (FindPrivateMappings, or a test's).
using MappingWalk = absl::FunctionRef<absl::StatusOr<std::vector<MappedFileRange>>(
    const std::vector<MappedFileKey>& files, int64_t since)>;

// Who maps what, for the instance that hands its RAM tiers' copies out to
// be mapped in place (to itself and to a node service's clients): a tier
// that wants room asks it for a walk of the node's processes, and frees
// the copies it held that nobody maps (SharedCopies::ReleaseUnmapped). A
// walk reads every process's maps: a tier has one at a time, one a second
// at most. One that cannot rule a process out is logged once a tier.
// Thread-safe.
class MappingWatch {
 public:
  explicit MappingWatch(int tiers) : tiers_(new PerTier[tiers]) {}  // Tiers 0..tiers-1.
  // Calls `release` (which walks at most once) unless tier `tier` walked
  // less than a second ago (0), and returns what it returns.
  uint64_t ReleaseUnmapped(int tier, absl::FunctionRef<uint64_t(MappingWalk walk)> release);

 private:
  struct PerTier {
    Mutex mu;
    std::optional<std::chrono::steady_clock::time_point> last_walk ABSL_GUARDED_BY(mu);
    bool warned ABSL_GUARDED_BY(mu) = false;
  };
  const std::unique_ptr<PerTier[]> tiers_;
};

}  // namespace monarch

#endif  // MONARCH_COMMON_PROCESS_MAPPINGS_H_
