// Keeping a node service's RAM tier across a restart: where the kept arena
// lives, and the journal of the copies it holds.
//
// A memfd dies with the last process that holds it, and under Slurm a job's
// end may kill every process of the job, a keeper included. A file on a
// tmpfs survives any process: a node service's RAM tier keeps its stripes,
// its slot table and its journal as files in a private directory,
// <node.ram_dir>/monarch-<uid>/<runtime dir, '/' as %2F>/<tier>/ (0700).
// node.ram_dir names the tmpfs; its default, `auto`, is /dev/shm under a
// batch job and otherwise a private tmpfs of 2 MiB pages, which survives
// any process but its keeper (service/ram_keeper.h). The next
// service on the same runtime directory (it holds monarch.lock: one owner at
// a time) adopts the copies the journal lists whose source is unchanged and
// whose bytes still have their CRC32C (ram_driver.cc). An idle exit, or
// node.keep_ram: false, removes the directory (DiscardKeptRam).
//
// The journal is a header then records, appended as copies are committed
// and removed (promotions and eviction, never a read), so that a service
// killed with SIGKILL leaves what it held. Each record carries its own
// CRC32C; anything unexpected in it discards the whole kept arena.
//
// Not thread-safe: the RAM driver serializes calls.

#ifndef MONARCH_DRIVERS_RAM_KEEP_H_
#define MONARCH_DRIVERS_RAM_KEEP_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "drivers/storage_driver.h"

namespace monarch {

// The kept arena's directory under `ram_dir` (node.ram_dir) for the service
// of `runtime_dir`, created 0700 and checked; FailedPrecondition, naming
// node.ram_dir, when `ram_dir` is missing or not a tmpfs.
absl::StatusOr<std::string> KeptRamDirectory(const std::string& ram_dir,
                                             const std::string& runtime_dir);
// Removes that directory and what it holds, if there is one: the kept
// copies' memory goes back once nobody maps it.
void DiscardKeptRam(const std::string& ram_dir, const std::string& runtime_dir);
// Its path, whether or not it exists (a RAM tier's files are under
// <path>/<tier name>/).
std::string KeptRamPath(const std::string& ram_dir, const std::string& runtime_dir);
// Whether `ram_dir` holds copies kept by an earlier service of
// `runtime_dir`, as that directory is now.
bool HoldsKeptRam(const std::string& ram_dir, const std::string& runtime_dir);

// The page size a new file in `dir` gets, by the options of the tmpfs that
// holds it in `mountinfo` (the text of /proc/self/mountinfo): 2 MiB where it
// is mounted huge=always or huge=within_size, or huge=advise when the file's
// mapping is advised (`advised`: the tier's huge_pages); else 4 KiB. 0 when
// no tmpfs holds `dir`. (The system-wide shmem_enabled "force" and "deny"
// override every mount; they are for testing, and not read here.)
uint64_t TmpfsPageSize(absl::string_view mountinfo, absl::string_view dir, bool advised);
// The same from this process's /proc/self/mountinfo, or for a `dir` under
// /proc/<pid>/root (a RAM keeper's: service/ram_keeper.h), from that
// process's mountinfo; 0 if unreadable.
uint64_t TmpfsPageSize(absl::string_view dir, bool advised);

// What the journal says the arena holds: one copy.
struct KeptCopy {
  std::string name;  // Dataset-relative.
  SourceIdentity source;
  uint32_t stripe = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t crc32c = 0;  // Of its `length` bytes.
};

class RamJournal {
 public:
  // The journal at `path` of an arena of `stripes` stripes for a tier of
  // `capacity` bytes.
  RamJournal(std::string path, uint32_t stripes, uint64_t capacity)
      : path_(std::move(path)), stripes_(stripes), capacity_(capacity) {}

  // The copies a journal left by an earlier service lists, by name; an
  // error (naming what is wrong) if there is none, or it is damaged, or it
  // is of an arena of another shape.
  absl::StatusOr<std::map<std::string, KeptCopy>> Read() const;

  // Starts a journal afresh that lists `copies` (by file id). On failure
  // the journal is removed and nothing more is written: copies are then
  // simply not kept.
  void Rewrite(absl::flat_hash_map<uint32_t, KeptCopy> copies);
  void Committed(uint32_t id, KeptCopy copy);
  void Removed(uint32_t id);

 private:
  void Append(const std::string& record);
  void GiveUp(const std::string& why);

  const std::string path_;
  const uint32_t stripes_;
  const uint64_t capacity_;
  ScopedFd fd_;
  uint64_t bytes_ = 0;       // Written to the journal so far.
  uint64_t live_bytes_ = 0;  // What a rewrite would write.
  absl::flat_hash_map<uint32_t, KeptCopy> live_;
};

}  // namespace monarch

#endif  // MONARCH_DRIVERS_RAM_KEEP_H_