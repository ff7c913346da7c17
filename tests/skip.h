// MONARCH_SKIP: a test case that cannot run on this machine says so.
//
// Kept apart from test_util.h so that the shared main (test_main.cc), which
// builds without the library's headers, can read the count.

#ifndef MONARCH_TESTS_SKIP_H_
#define MONARCH_TESTS_SKIP_H_

#include <doctest/doctest.h>

#include <atomic>

namespace monarch::testing {

// A test case that cannot run on this machine (no O_DIRECT, no THP, not
// root) returns through MONARCH_SKIP(reason): the binary then exits with
// kSkipExitCode, which ctest reports as skipped rather than passed.
inline constexpr int kSkipExitCode = 77;
inline std::atomic<int>& SkippedCounter() {
  static std::atomic<int> skipped{0};
  return skipped;
}
inline int SkippedCount() { return SkippedCounter().load(); }
#define MONARCH_SKIP(reason)                                 \
  do {                                                       \
    MESSAGE("SKIPPED: " << reason);                          \
    ::monarch::testing::SkippedCounter().fetch_add(1);      \
    return;                                                  \
  } while (0)

}  // namespace monarch::testing

#endif  // MONARCH_TESTS_SKIP_H_
