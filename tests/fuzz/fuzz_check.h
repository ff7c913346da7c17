// FUZZ_CHECK: an invariant of a fuzz target. A violation prints what broke
// and aborts, which libFuzzer reports as a crash and saves the input for.
// (assert() would vanish in the release builds the fuzzers are made in.)

#ifndef MONARCH_TESTS_FUZZ_FUZZ_CHECK_H_
#define MONARCH_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

namespace monarch::fuzz {

[[noreturn]] inline void Fail(const char* file, int line, const char* condition,
                              const std::string& detail) {
  std::fprintf(stderr, "%s:%d: invariant failed: %s\n  %s\n", file, line, condition,
               detail.c_str());
  std::abort();
}

}  // namespace monarch::fuzz

// `detail` (a std::string) is evaluated only when `condition` is false.
#define FUZZ_CHECK(condition, detail)                                                  \
  do {                                                                                 \
    if (!(condition)) ::monarch::fuzz::Fail(__FILE__, __LINE__, #condition, (detail)); \
  } while (0)

#endif  // MONARCH_TESTS_FUZZ_FUZZ_CHECK_H_
