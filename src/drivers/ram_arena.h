// RamArena: the memory a RAM tier keeps its copies in.
//
// A few memfds ("stripes"), each sized once to the whole arena (sparse:
// memory is used only where bytes are written), mapped writable once and
// then sealed against any other write (CreateWriteSealedRegion): no other
// process, not even one of the same user reopening the memfd through
// /proc/<pid>/fd, can alter a copy, so RAM copies need no checksums. Reads
// memcpy out of a second, read-only mapping.
//
// Writes are stores into the writable mapping, after MADV_POPULATE_WRITE
// has allocated the pages. pwrite() was faster (it allocates whole pages
// without zeroing them first: 1 GiB in 0.29 s against 0.49 s,
// bench/results/profile.md), but a write-sealed memfd refuses it, and the
// seal is what makes the tier tamper-proof. Only promotions pay, off the
// read path. Why stripes: extents are dealt out across them in turn, so
// writers of different copies work on different memfds and their page
// allocations contend less; each stripe has room for the whole arena, so
// any extent fits in any stripe. A memfd is also memory another process can
// map, which is what a node-wide RAM tier needs.
//
// Space is handed out in extents aligned to 64 bytes (a cache line, so copies
// never share one), or to a page for copies that may be mapped in place,
// first fit from freed extents, else from the stripe's end.
// Freed pages stay allocated and are reused by later copies: giving them
// back and taking them again would zero them twice. A write-sealed memfd
// refuses hole punching anyway. A releasable arena (memory.watch: a RAM tier
// that yields under memory pressure) is not write-sealed, and
// ReleaseFreePages() punches the freed pages out when the tier shrinks.
// The arena does not enforce the total: the tier's capacity accounting does.
//
// A kept arena (Options::kept_dir, a node service's: ram_keep.h) has files
// on a tmpfs for stripes, which outlive the process. A tmpfs file cannot be
// sealed: it is releasable, as above, and a process of the same user could
// write it; clients still get read-only descriptors.
//
// Backing ahead (Options::back_ahead): the first store into a page the
// tier never used costs the kernel allocating and zeroing it, and on a VM
// the hypervisor backing it too; that is most of a copy's cost (0.8 ms per
// MiB against 0.2 ms into a page already there, bench_fill_memory). A
// thread at the lowest CPU priority keeps that many bytes past each
// stripe's end allocated ahead of the copies, so a copy that comes after a
// pause only stores. It never backs more than the arena's size in all, and
// it stops for good once ReleaseFreePages() gives memory back (memory
// pressure shrinks the tier) or the kernel refuses it memory.
//
// Thread-safe. The mapping stays valid for the arena's lifetime.

#ifndef MONARCH_DRIVERS_RAM_ARENA_H_
#define MONARCH_DRIVERS_RAM_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file_util.h"
#include "common/mutex.h"
#include "common/shared_memory.h"

namespace monarch {

// How a RamArena is made.
struct RamArenaOptions {
  // The pages are allocated as 2 MiB ones where the kernel allows it
  // (TierConfig::huge_pages).
  bool huge_pages = false;
  // The stripes are not sealed against writes, so that ReleaseFreePages()
  // can give pages back (shared_memory.h says what that costs).
  bool releasable = false;
  // Bytes kept allocated past the stripes' ends, in all (TierConfig::
  // back_ahead); 0: none, and no thread.
  uint64_t back_ahead = 0;
  // Not empty: the stripes are the files stripe-<i> in this directory (a
  // tmpfs), created or reopened, grown to the size asked for but never
  // shrunk (a reader of the service before may still map them).
  std::string kept_dir;
};

class RamArena {
 public:
  // Where an extent lies: a stripe and an offset in it.
  struct Extent {
    uint32_t stripe = 0;
    uint64_t offset = 0;
  };

  using Options = RamArenaOptions;

  // `stripes` memfds of `bytes` of address space each; `name` shows in
  // /proc/<pid>/maps.
  static absl::StatusOr<std::unique_ptr<RamArena>> Create(uint64_t bytes, int stripes,
                                                          const std::string& name,
                                                          const Options& options = {});
  // The arena of another process (the node service), from its stripes'
  // descriptors, mapped read-only: data() works, Allocate() and Write() must
  // not be called. Mapped so that 2 MiB pages, if the arena has them, are
  // mapped whole.
  static absl::StatusOr<std::unique_ptr<RamArena>> MapReadOnly(std::vector<ScopedFd> stripe_fds);
  ~RamArena();
  RamArena(const RamArena&) = delete;
  RamArena& operator=(const RamArena&) = delete;

  // An extent of at least `n` bytes (n > 0) whose offset is a multiple of
  // `alignment` (a power of two; 64 at least); ResourceExhausted if its
  // stripe has no room left.
  absl::StatusOr<Extent> Allocate(uint64_t n, uint64_t alignment = 64);
  // Returns an extent from Allocate(n) with the same `n`.
  void Free(Extent extent, uint64_t n);

  // Gives the pages no extent uses back to the kernel (punches them out of
  // the stripes' memfds), in a releasable arena; nothing otherwise. Only
  // whole pages are released: one that a live extent shares stays. A reader
  // still inside a freed extent (its seqlock check then fails) reads zeros,
  // never faults: the size does not change. Returns the bytes of memory the
  // arena held before less those it holds after.
  uint64_t ReleaseFreePages();
  // A kept arena reopened: the extents (each with its length) that copies
  // kept in it use become allocated, every other page is punched out.
  // Before any Allocate().
  void Adopt(const std::vector<std::pair<Extent, uint64_t>>& kept);
  // Memory the stripes hold now (their memfds' allocated pages).
  uint64_t resident_bytes() const;
  bool releasable() const { return releasable_; }
  // Bytes the back-ahead thread has allocated so far, in all.
  uint64_t backed_ahead_bytes() const { return backed_ahead_bytes_.load(std::memory_order_relaxed); }
  // What backing ahead may still allocate, until told again. A releasable
  // arena (one that memory.watch governs) starts at 0, waiting for the
  // governor's word: memory taken ahead must not eat the headroom it keeps.
  // Others have no such bound.
  void AllowBackingAhead(uint64_t bytes);
  // Waits until every stripe is backed `back_ahead` past its end (or the
  // thread cannot go on: the arena's size or allowance, or it stopped); for
  // tests and benchmarks. True at once without back_ahead.
  bool WaitUntilBackedAhead(std::chrono::steady_clock::duration timeout);

  // Writes bytes at `offset` within `extent`. ResourceExhausted when the
  // kernel refuses memory.
  absl::Status Write(Extent extent, uint64_t offset, const char* data, size_t n);

  // Maps the extent's pages into this process's page tables ahead of its
  // first reads, so they do not each take a page fault. Best effort.
  void PrepareForReading(Extent extent, uint64_t n) const;

  // The bytes of an extent, in the read-only mapping of its stripe.
  const char* data(Extent extent) const { return stripes_[extent.stripe]->base + extent.offset; }

  // Copies `n` bytes at `at` (an extent, or a position inside one) to `dst`
  // with pread() of the stripe's memfd: the kernel copies from its pages,
  // and nothing is mapped into this process. The rest of a pread that falls
  // short is copied through the mapping.
  void CopyWithoutMapping(Extent at, char* dst, size_t n) const;

  uint64_t stripe_bytes() const { return size_; }
  int stripe_count() const { return static_cast<int>(stripes_.size()); }
  // The memfd behind a stripe (its size is sealed), for sharing it.
  int stripe_fd(int stripe) const { return stripes_[stripe]->fd; }

 private:
  struct Stripe {
    int fd = -1;
    char* base = nullptr;    // Read-only.
    MappedRegion mapping;    // Owns `base` in a read-only arena.
    MappedRegion writable;   // The one writable mapping (not in a read-only arena).
    Mutex mu;
    uint64_t end ABSL_GUARDED_BY(mu) = 0;                 // Everything from here on is free.
    std::map<uint64_t, uint64_t> free ABSL_GUARDED_BY(mu);  // Offset -> length, below end.
    // Pages below this are allocated (by copies or backed ahead); at least
    // the highest `end` so far, which freed extents keep allocated.
    uint64_t backed ABSL_GUARDED_BY(mu) = 0;
  };

  // Punches the pages of `stripe` no extent uses out of its file.
  void PunchFree(Stripe& stripe) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);

  RamArena(uint64_t size, bool releasable) : size_(size), releasable_(releasable) {}

  // The back-ahead thread, and one step of it: backs the next piece of the
  // stripe furthest behind; false when none is.
  void BackAheadLoop();
  bool BackOneStep();
  // What BackOneStep() would back next: a stripe and a range, or none.
  struct Backlog {
    Stripe* stripe = nullptr;
    uint64_t begin = 0, end = 0;
  };
  Backlog NextBacklog();

  const uint64_t size_;  // Of each stripe.
  const bool releasable_;
  uint64_t back_ahead_per_stripe_ = 0;
  std::vector<std::unique_ptr<Stripe>> stripes_;
  std::atomic<uint32_t> next_stripe_{0};

  std::atomic<uint64_t> backed_ahead_bytes_{0};
  std::atomic<uint64_t> backing_allowance_{0};  // Set by Create() and AllowBackingAhead().
  std::atomic<bool> stepping_{false};  // A step of the backer is under way (BackOneStep).
  // Held through each back-ahead step, and by ReleaseFreePages(): pages a
  // step allocates are never ones a release has just given back.
  Mutex step_mu_;
  Mutex backer_mu_;
  CondVar backer_wake_;  // An allocation came near the backed end; or stop.
  bool backer_stop_ ABSL_GUARDED_BY(backer_mu_) = false;
  bool backing_given_up_ ABSL_GUARDED_BY(backer_mu_) = false;
  std::thread backer_;
};

}  // namespace monarch

#endif  // MONARCH_DRIVERS_RAM_ARENA_H_
