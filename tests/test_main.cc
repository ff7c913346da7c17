// doctest's main, shared by every test binary, with three additions:
// - A run filtered to named test cases (ctest runs each case with
//   --test-case=NAME) that matches none fails. Otherwise a name ctest cannot
//   pass through whole (a ';' splits it into two entries, neither of which
//   matches anything) would show as two passing tests that ran nothing.
// - A test case that cannot run on this machine says so with
//   MONARCH_SKIP(reason) (skip.h): a run in which nothing failed and
//   something skipped exits 77, which ctest reports as skipped
//   (SKIP_RETURN_CODE, tests/CMakeLists.txt), not passed.
// - The user's runtime directory (XDG_RUNTIME_DIR: where namespaces are kept
//   on the node, dataset.keep_namespace, and default service directories)
//   is a fresh one of this run's, removed at its end.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "skip.h"

namespace {

int test_cases_matched = -1;  // Set at the end of a run.

// A listener that only notes how many test cases passed the filters.
struct MatchCounter : doctest::IReporter {
  explicit MatchCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    test_cases_matched = static_cast<int>(stats.numTestCasesPassingFilters);
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("match_counter", 1, MatchCounter);

bool NamesTestCases(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--test-case=", 12) == 0 || std::strncmp(argv[i], "-tc=", 4) == 0) {
      return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  char runtime[] = "/tmp/mtest.XXXXXX";  // Short: service sockets go below it.
  if (::mkdtemp(runtime) != nullptr) ::setenv("XDG_RUNTIME_DIR", runtime, 1);
  struct RemoveRuntime {
    const char* dir;
    ~RemoveRuntime() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } remove_runtime{runtime};
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit() || result != 0) return result;
  if (NamesTestCases(argc, argv) && test_cases_matched == 0) {
    std::fprintf(stderr,
                 "no test case matched --test-case (a ';' in a test case's name splits it in "
                 "ctest: leave it out)\n");
    return 1;
  }
  if (monarch::testing::SkippedCount() > 0) {
    std::fprintf(stderr, "%d test case(s) skipped: this machine cannot run them\n",
                 monarch::testing::SkippedCount());
    return monarch::testing::kSkipExitCode;
  }
  return result;
}
