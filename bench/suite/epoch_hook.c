// LD_PRELOAD hook that gives bench/suite/run_suite.py an exact epoch boundary
// inside one monarch-epochs process.
//
// With --drop-caches, monarch-epochs calls sync() once before every epoch
// (after the previous epoch's readers joined and, with --settle, after
// background placement finished), and nothing else in it calls sync(). This
// sync() does the real sync, then writes one byte to the fd named by
// MONARCH_SUITE_HOOK_REQ_FD and blocks until one byte arrives on
// MONARCH_SUITE_HOOK_ACK_FD. Meanwhile the suite reads the PFS emulator's
// exact counters and resets them, so each epoch's PFS traffic is counted
// alone, while the Monarch instance (and its tiers) lives across epochs.
// Without those variables it is a plain sync().
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

void sync(void) {
  syscall(SYS_sync);
  const char* req = getenv("MONARCH_SUITE_HOOK_REQ_FD");
  const char* ack = getenv("MONARCH_SUITE_HOOK_ACK_FD");
  if (req == NULL || ack == NULL) return;
  char byte = 's';
  ssize_t n;
  do n = write(atoi(req), &byte, 1); while (n < 0 && errno == EINTR);
  if (n != 1) return;  // The suite is gone: carry on unhooked.
  do n = read(atoi(ack), &byte, 1); while (n < 0 && errno == EINTR);
}
