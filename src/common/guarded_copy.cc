// GuardedCopy: SIGBUS recovery around copies from mappings.

#include "common/guarded_copy.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <ucontext.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "common/copy_bytes.h"

namespace monarch {
namespace {

// volatile: the handler reads it, and memcpy being a builtin the compiler
// would otherwise drop the store before the copy as dead.
thread_local sigjmp_buf* volatile t_recovery = nullptr;
struct sigaction g_previous;

void OnSigbus(int signal, siginfo_t* info, void* context) {
  if (sigjmp_buf* recovery = t_recovery) {
    t_recovery = nullptr;
    // The jump leaves the handler without the kernel restoring the signal
    // mask, and the recovery point does not save it (a system call per
    // copy). So the mask the thread had when it faulted is put back here,
    // on the fault path only. Without this, a handler installed around ours
    // that blocks signals while it runs (ThreadSanitizer's blocks them all)
    // leaves SIGBUS blocked, and the thread's next fault kills the process.
    ::pthread_sigmask(SIG_SETMASK, &static_cast<ucontext_t*>(context)->uc_sigmask, nullptr);
    siglongjmp(*recovery, 1);
  }
  // Not ours: behave as if we had never been installed.
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(signal, info, context);
  } else if (g_previous.sa_handler != SIG_IGN && g_previous.sa_handler != SIG_DFL) {
    g_previous.sa_handler(signal);
  } else {
    ::sigaction(SIGBUS, &g_previous, nullptr);
    ::raise(SIGBUS);  // Delivered when this handler returns: the default action.
  }
}

void InstallOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action = {};
    action.sa_sigaction = OnSigbus;
    // SA_NODEFER: SIGBUS stays unblocked after the jump out of the handler,
    // so the recovery point need not save the signal mask (a system call).
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &g_previous);
  });
}

}  // namespace

bool GuardedCopy(void* dst, const void* src, size_t n) {
  InstallOnce();
  sigjmp_buf recovery;
  // volatile: read after a jump back into this frame.
  volatile bool faulted = false;
  if (sigsetjmp(recovery, 0) == 0) {
    t_recovery = &recovery;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    CopyBytes(dst, src, n);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    faulted = true;
  }
  t_recovery = nullptr;
  return !faulted;
}

}  // namespace monarch
