// GuardedCopy: memcpy out of a file mapping that may shrink under us.
//
// Why: a mapped tier copy (pmem) truncated by someone else turns every access
// past its new end into SIGBUS, which kills the process. The copy runs with a
// per-thread recovery point; the SIGBUS handler, installed once, jumps back
// to it and the copy reports failure instead. A SIGBUS outside a guarded copy
// goes to the handler that was there before (or the default action), so the
// application's own handling is unchanged.
//
// Cost: one sigsetjmp without saving the signal mask (no system call) per
// copy. Thread-safe.

#ifndef MONARCH_COMMON_GUARDED_COPY_H_
#define MONARCH_COMMON_GUARDED_COPY_H_

#include <cstddef>

namespace monarch {

// Copies `n` bytes from `src` (inside a file mapping) to `dst`. False if the
// mapping faulted (the file shrank): `dst` then holds garbage.
bool GuardedCopy(void* dst, const void* src, size_t n);

}  // namespace monarch

#endif  // MONARCH_COMMON_GUARDED_COPY_H_
