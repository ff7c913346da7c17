// CopyLeases: see copy_lease.h.

#include "drivers/copy_lease.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>

#include "common/os.h"

namespace monarch::copy_lease {
namespace {

constexpr int kMaxDescriptor = 1 << 16;

// One mark per descriptor number, set by the signal handler: lock-free
// atomics are async-signal-safe.
std::atomic<uint8_t> g_broken[kMaxDescriptor];
static_assert(std::atomic<uint8_t>::is_always_lock_free);

int LeaseSignal() { return SIGRTMAX - 3; }

// Runs in whatever thread the kernel picks; only async-signal-safe calls.
void OnLeaseBreak(int, siginfo_t* info, void*) {
  const int saved_errno = errno;
  const int fd = info->si_fd;
  if (fd >= 0 && fd < kMaxDescriptor) {
    // The mark first: the writer is held until the lease is let go below.
    g_broken[fd].store(1, std::memory_order_seq_cst);
    // A direct call, not the os seam: a test Env is no place for a signal
    // handler to run.
    ::syscall(SYS_fcntl, fd, F_SETLEASE, F_UNLCK);
  }
  errno = saved_errno;
}

// Installs the handler unless the signal is taken: true if ours is there.
bool InstallOnce() {
  static const bool installed = [] {
    struct sigaction current;
    if (::sigaction(LeaseSignal(), nullptr, &current) != 0) return false;
    if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler != SIG_DFL) return false;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction != &OnLeaseBreak) return false;
    struct sigaction ours = {};
    ours.sa_sigaction = &OnLeaseBreak;
    ours.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&ours.sa_mask);
    return ::sigaction(LeaseSignal(), &ours, nullptr) == 0;
  }();
  return installed;
}

}  // namespace

bool Take(int fd) {
  if (fd < 0 || fd >= kMaxDescriptor || !InstallOnce()) return false;
  g_broken[fd].store(0, std::memory_order_seq_cst);
  return os::SetLease(fd, LeaseSignal(), F_RDLCK) == 0;
}

bool TakeAgain(int fd) {
  if (fd < 0 || fd >= kMaxDescriptor || !InstallOnce()) return false;
  return os::SetLease(fd, LeaseSignal(), F_RDLCK) == 0;
}

bool Broken(int fd) {
  return fd >= 0 && fd < kMaxDescriptor && g_broken[fd].load(std::memory_order_seq_cst) != 0;
}

}  // namespace monarch::copy_lease
