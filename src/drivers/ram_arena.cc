// RamArena implementation.

#include "drivers/ram_arena.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/copy_bytes.h"
#include "common/file_util.h"
#include "common/guarded_copy.h"
#include "common/os.h"
#include "common/shared_memory.h"
#include "common/status_macros.h"

namespace monarch {
namespace {

constexpr uint64_t kAlign = 64;
constexpr uint64_t kPage = 4096;

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// Asks for 2 MiB pages in a mapping of the arena. A process that maps the
// arena afresh (a node service's client, a DataLoader worker forked for
// each epoch) takes a page fault per 4 KiB page it touches, which costs
// more than copying the bytes: on the 2-core VM a fresh client reads at
// 0.35x a warm one's speed (bench_client_hit), and populating the pages in
// bulk (MADV_POPULATE_READ) costs as much. With 2 MiB pages it is one fault
// per 2 MiB: 0.96x. (Without them, a forked client copies with pread()
// until it reads a file again: RamReader in ram_driver.cc.) Advised on the
// writer's mapping, the pages are allocated as 2 MiB ones; on a reader's,
// such pages are mapped whole (advising a reader of 4 KiB pages changes
// nothing). The kernel honours this for memfds only where
// /sys/kernel/mm/transparent_hugepage/shmem_enabled is "advise" (or
// "always", "within_size"); at its default, "never", it does nothing.
void AdviseHugePages(char* base, uint64_t size) { ::madvise(base, size, MADV_HUGEPAGE); }

// A kept arena's stripe files in `dir`, opened or made; `size` grows to
// the largest one's.
absl::StatusOr<std::vector<ScopedFd>> OpenKeptStripes(const std::string& dir, int stripes,
                                                      uint64_t* size) {
  std::vector<ScopedFd> files;
  for (int i = 0; i < std::max(stripes, 1); ++i) {
    const std::string path = JoinPath(dir, absl::StrCat("stripe-", i));
    files.emplace_back(os::Open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    struct stat st;
    if (!files.back().valid() || os::Fstat(files.back().get(), &st) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("open ", path));
    }
    *size = std::max(*size, RoundUp(static_cast<uint64_t>(st.st_size), kPage));
  }
  return files;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RamArena>> RamArena::Create(uint64_t bytes, int stripes,
                                                           const std::string& name,
                                                           const Options& options) {
  uint64_t size = RoundUp(bytes == 0 ? kPage : bytes, kPage);
  const bool huge_pages = options.huge_pages;
  const bool kept = !options.kept_dir.empty();
  std::vector<ScopedFd> files;  // A kept arena's, reopened or new.
  if (kept) {
    MONARCH_ASSIGN_OR_RETURN(files, OpenKeptStripes(options.kept_dir, stripes, &size));
  }
  std::unique_ptr<RamArena> arena(new RamArena(size, options.releasable || kept));
  for (int i = 0; i < std::max(stripes, 1); ++i) {
    WriteSealedRegion region;
    if (kept) {
      region.fd = std::move(files[i]);
      if (os::Ftruncate(region.fd.get(), static_cast<off_t>(size)) != 0) {
        return ErrnoToStatus(errno, absl::StrCat("size ", options.kept_dir, "/stripe-", i));
      }
      MONARCH_ASSIGN_OR_RETURN(region.writable, MappedRegion::Map(region.fd.get(), true, true));
    } else {
      MONARCH_ASSIGN_OR_RETURN(
          region, CreateWriteSealedRegion(name, size, /*seal_writes=*/!options.releasable));
    }
    auto stripe = std::make_unique<Stripe>();
    stripe->fd = region.fd.release();
    stripe->writable = std::move(region.writable);
    arena->stripes_.push_back(std::move(stripe));  // From here on the destructor cleans up.
    Stripe& s = *arena->stripes_.back();
    // Reads go through a read-only mapping: a stray pointer of ours cannot
    // write a copy either. MAP_NORESERVE: the size is address space, not a
    // commitment.
    void* base = os::Mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_NORESERVE, s.fd, 0);
    if (base == MAP_FAILED) return ErrnoToStatus(errno, absl::StrCat("map ", name));
    s.base = static_cast<char*>(base);
    if (huge_pages) {
      AdviseHugePages(s.writable.data(), size);  // Where the pages are allocated.
      AdviseHugePages(s.base, size);
    }
  }
  arena->backing_allowance_.store(arena->releasable_ ? 0 : ~uint64_t{0});
  if (options.back_ahead > 0) {
    arena->back_ahead_per_stripe_ =
        RoundUp(std::max<uint64_t>(options.back_ahead / arena->stripes_.size(), kPage), kPage);
    arena->backer_ = std::thread([a = arena.get()] { a->BackAheadLoop(); });
  }
  return arena;
}

absl::StatusOr<std::unique_ptr<RamArena>> RamArena::MapReadOnly(std::vector<ScopedFd> fds) {
  if (fds.empty()) return absl::InvalidArgumentError("a RAM arena needs at least one stripe");
  std::unique_ptr<RamArena> arena;
  for (ScopedFd& fd : fds) {
    MONARCH_ASSIGN_OR_RETURN(MappedRegion region,
                             MappedRegion::Map(fd.get(), /*writable=*/false, /*own_file=*/true));
    if (arena == nullptr) arena.reset(new RamArena(region.size(), /*releasable=*/false));
    if (region.size() != arena->size_) {
      return absl::FailedPreconditionError("RAM arena stripes of different sizes");
    }
    auto stripe = std::make_unique<Stripe>();
    stripe->fd = fd.release();
    stripe->mapping = std::move(region);
    stripe->base = stripe->mapping.data();
    AdviseHugePages(stripe->base, arena->size_);
    arena->stripes_.push_back(std::move(stripe));
  }
  return arena;
}

RamArena::~RamArena() {
  if (backer_.joinable()) {
    {
      MutexLock lock(&backer_mu_);
      backer_stop_ = true;
    }
    backer_wake_.SignalAll();
    backer_.join();
  }
  for (const std::unique_ptr<Stripe>& stripe : stripes_) {
    if (stripe->base != nullptr && stripe->mapping.data() == nullptr) os::Munmap(stripe->base, size_);
    os::Close(stripe->fd);
  }
}

absl::StatusOr<RamArena::Extent> RamArena::Allocate(uint64_t n, uint64_t alignment) {
  n = RoundUp(n, kAlign);
  alignment = std::max(alignment, kAlign);
  const uint32_t index = next_stripe_.fetch_add(1, std::memory_order_relaxed) % stripes_.size();
  Stripe& stripe = *stripes_[index];
  uint64_t offset = 0;
  bool wake_backer = false;
  {
    MutexLock lock(&stripe.mu);
    for (auto it = stripe.free.begin(); it != stripe.free.end(); ++it) {
      const uint64_t begin = it->first, end = it->first + it->second;
      offset = RoundUp(begin, alignment);
      if (offset + n > end) continue;
      // What the alignment skips stays free, before and after.
      stripe.free.erase(it);
      if (offset > begin) stripe.free.emplace(begin, offset - begin);
      if (end > offset + n) stripe.free.emplace(offset + n, end - (offset + n));
      return Extent{index, offset};
    }
    offset = RoundUp(stripe.end, alignment);
    if (offset + n > size_ || offset + n < offset) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "RAM tier arena stripe full: ", n, " bytes wanted, ", size_ - stripe.end, " left"));
    }
    if (offset > stripe.end) stripe.free.emplace(stripe.end, offset - stripe.end);
    stripe.end = offset + n;
    // Half the window used: the backer has work.
    wake_backer = back_ahead_per_stripe_ > 0 &&
                  stripe.end + back_ahead_per_stripe_ / 2 > stripe.backed;
  }
  // After the stripe's lock is let go: the backer takes stripes' locks,
  // never the reverse.
  if (wake_backer) backer_wake_.Signal();
  return Extent{index, offset};
}

RamArena::Backlog RamArena::NextBacklog() {
  constexpr uint64_t kStep = 2 << 20;  // Short enough for a release to wait on.
  Backlog next;
  uint64_t total_backed = 0, least_ahead = ~uint64_t{0};
  for (const std::unique_ptr<Stripe>& stripe : stripes_) {
    MutexLock lock(&stripe->mu);
    stripe->backed = std::max(stripe->backed, stripe->end);
    total_backed += stripe->backed;
    const uint64_t target = std::min(size_, stripe->end + back_ahead_per_stripe_);
    if (stripe->backed >= target) continue;
    const uint64_t ahead = stripe->backed - stripe->end;
    if (ahead < least_ahead) {
      least_ahead = ahead;
      next = Backlog{stripe.get(), stripe->backed, std::min(target, stripe->backed + kStep)};
    }
  }
  // Never more than the arena's size in all: what the tier could hold.
  if (next.stripe != nullptr && total_backed + (next.end - next.begin) > size_) return Backlog{};
  return next;
}

bool RamArena::BackOneStep() {
  MutexLock step(&step_mu_);
  {
    MutexLock lock(&backer_mu_);
    if (backing_given_up_) return false;
  }
  const Backlog next = NextBacklog();
  if (next.stripe == nullptr) return false;
  // From before the allowance is taken to the step's end: a waiter must not
  // take the spent allowance for the step done.
  stepping_.store(true);
  absl::Cleanup step_done = [this] { stepping_.store(false); };
  // Within the allowance (memory.watch's headroom), taken before the pages.
  uint64_t allowed = backing_allowance_.load(std::memory_order_relaxed);
  do {
    if (allowed < next.end - next.begin) return false;
  } while (!backing_allowance_.compare_exchange_weak(allowed, allowed - (next.end - next.begin)));
  // Allocates the pages, zeroed, and maps them writable here, so a copy's
  // stores find them. Pages a copy is writing meanwhile (an extent handed
  // out past `backed`) are left as they are: this only faults pages in.
  if (::madvise(next.stripe->writable.data() + next.begin, next.end - next.begin,
                MADV_POPULATE_WRITE) != 0) {
    // ENOMEM (a memory cgroup's limit) or a kernel without the advice:
    // copies allocate their own pages from now on, as without the key.
    MutexLock lock(&backer_mu_);
    backing_given_up_ = true;
    return false;
  }
  MutexLock lock(&next.stripe->mu);
  if (next.stripe->backed == next.begin) next.stripe->backed = next.end;
  backed_ahead_bytes_.fetch_add(next.end - next.begin, std::memory_order_relaxed);
  return true;
}

void RamArena::BackAheadLoop() {
  ::pthread_setname_np(::pthread_self(), "monarch-backer");
  // Only CPU time nobody else wants: zeroing pages ahead must not slow the
  // readers it is meant to spare.
  struct sched_param idle = {};
  (void)::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &idle);
  while (true) {
    {
      MutexLock lock(&backer_mu_);
      if (backer_stop_) return;
    }
    if (BackOneStep()) continue;
    MutexLock lock(&backer_mu_);
    if (backer_stop_) return;
    // Woken by an allocation; the timeout covers a wake-up that came
    // between the step and this wait.
    backer_wake_.WaitUntil(&backer_mu_,
                           std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
  }
}

void RamArena::AllowBackingAhead(uint64_t bytes) {
  backing_allowance_.store(bytes, std::memory_order_relaxed);
  if (back_ahead_per_stripe_ > 0 && bytes > 0) backer_wake_.Signal();
}

bool RamArena::WaitUntilBackedAhead(std::chrono::steady_clock::duration timeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (back_ahead_per_stripe_ > 0) {
    {
      MutexLock lock(&backer_mu_);
      if (backing_given_up_) return true;
    }
    // Done if nothing is left that the allowance allows, and no step that
    // took allowance is still under way (checked last: a step sets it
    // before taking any).
    const Backlog next = NextBacklog();
    const bool done =
        next.stripe == nullptr || backing_allowance_.load() < next.end - next.begin;
    if (done && !stepping_.load()) return true;
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

void RamArena::Free(Extent extent, uint64_t n) {
  Stripe& stripe = *stripes_[extent.stripe];
  uint64_t offset = extent.offset;
  n = RoundUp(n, kAlign);
  MutexLock lock(&stripe.mu);
  auto next = stripe.free.lower_bound(offset);
  if (next != stripe.free.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == offset) {
      offset = previous->first;
      n += previous->second;
      stripe.free.erase(previous);
    }
  }
  if (next != stripe.free.end() && offset + n == next->first) {
    n += next->second;
    stripe.free.erase(next);
  }
  if (offset + n == stripe.end) {
    stripe.end = offset;
  } else {
    stripe.free.emplace(offset, n);
  }
}

uint64_t RamArena::resident_bytes() const {
  uint64_t bytes = 0;
  for (const std::unique_ptr<Stripe>& stripe : stripes_) {
    struct stat st;
    if (os::Fstat(stripe->fd, &st) == 0) bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

uint64_t RamArena::ReleaseFreePages() {
  if (!releasable_) return 0;
  // Memory pressure shrinks the tier: memory taken ahead of need would
  // bring it back (a shrink leaves about as much free as the window), so
  // backing ahead ends for good, and none is under way while pages are
  // given back.
  MutexLock step(&step_mu_);
  {
    MutexLock lock(&backer_mu_);
    backing_given_up_ = true;
  }
  const uint64_t before = resident_bytes();
  for (const std::unique_ptr<Stripe>& stripe : stripes_) {
    // Held while punching, so that no extent is handed out of a range being
    // punched (its writer's pages would vanish under it).
    MutexLock lock(&stripe->mu);
    PunchFree(*stripe);
  }
  const uint64_t after = resident_bytes();
  return before > after ? before - after : 0;
}

void RamArena::PunchFree(Stripe& stripe) {
  auto punch = [&](uint64_t begin, uint64_t end) {
    begin = RoundUp(begin, kPage);
    end = end / kPage * kPage;
    if (end <= begin) return;
    // A failure (a kernel without shmem hole punching) leaves the pages
    // allocated: they are reused by later copies, as without the key.
    (void)os::Fallocate(stripe.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        static_cast<off_t>(begin), static_cast<off_t>(end - begin));
  };
  for (const auto& [offset, length] : stripe.free) punch(offset, offset + length);
  punch(stripe.end, size_);
  stripe.backed = stripe.end;
}

void RamArena::Adopt(const std::vector<std::pair<Extent, uint64_t>>& kept) {
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> used(stripes_.size());
  for (const auto& [extent, n] : kept) used[extent.stripe].emplace_back(extent.offset, RoundUp(n, kAlign));
  for (size_t i = 0; i < stripes_.size(); ++i) {
    std::sort(used[i].begin(), used[i].end());
    Stripe& stripe = *stripes_[i];
    MutexLock lock(&stripe.mu);
    stripe.free.clear();
    uint64_t at = 0;
    for (const auto& [offset, n] : used[i]) {
      if (offset > at) stripe.free.emplace(at, offset - at);
      at = offset + n;
    }
    stripe.end = at;
    PunchFree(stripe);
  }
}

void RamArena::PrepareForReading(Extent extent, uint64_t n) const {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;  // Linux 5.14; older kernels refuse it, harmlessly.
#endif
  const uint64_t begin = extent.offset / kPage * kPage;
  const uint64_t end = RoundUp(extent.offset + n, kPage);
  ::madvise(stripes_[extent.stripe]->base + begin, end - begin, MADV_POPULATE_READ);
}

void RamArena::CopyWithoutMapping(Extent at, char* dst, size_t n) const {
  absl::StatusOr<size_t> got = PreadFull(stripes_[at.stripe]->fd, dst, n, at.offset, "RAM arena");
  // A failed or short read is not expected of a memfd inside its size; the
  // mapping has the bytes.
  const size_t done = got.ok() ? *got : 0;
  if (done < n) CopyBytes(dst + done, data(at) + done, n - done);
}

absl::Status RamArena::Write(Extent extent, uint64_t offset, const char* data, size_t n) {
  const uint64_t at = extent.offset + offset;
  if (at < extent.offset || at > size_ || n > size_ - at) {
    return absl::OutOfRangeError("write past the end of the RAM tier arena");
  }
  // The stripe is sealed against write(), so the bytes go through its one
  // writable mapping. The pages are allocated first, in one call that fails
  // with ENOMEM (a memory cgroup limit, say) where a store into a missing
  // page would take SIGBUS; the copy is guarded all the same, for kernels
  // before 5.14 that lack MADV_POPULATE_WRITE (EINVAL).
  char* to = stripes_[extent.stripe]->writable.data() + at;
  const uint64_t begin = at / kPage * kPage;
  const uint64_t end = RoundUp(at + n, kPage);
  if (n > 0 && ::madvise(stripes_[extent.stripe]->writable.data() + begin, end - begin,
                         MADV_POPULATE_WRITE) != 0 &&
      errno != EINVAL) {
    return absl::ResourceExhaustedError(
        absl::StrCat("RAM tier: no memory for ", n, " bytes: ", std::strerror(errno)));
  }
  if (!GuardedCopy(to, data, n)) {
    return absl::ResourceExhaustedError(absl::StrCat("RAM tier: no memory for ", n, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace monarch
