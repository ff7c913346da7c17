// FileRegex: the dataset's name filter (dataset.file_regex), a POSIX
// extended regular expression matched against whole dataset-relative names.
//
// POSIX regex rather than std::regex, which is several times slower per
// match and would dominate a million-file walk. glibc compiles a bounded
// repetition X{m,n} by copying X n times, so nested ones multiply:
// "(.{0,255}){0,255}" takes 4 to 23 GB inside regcomp(). Patterns are
// therefore refused when their bounded repetitions expand past
// kMaxRegexPositions. Measured on glibc 2.36, peak memory of regcomp():
// ".{0,2000}" 63 MB, ".{0,5000}" 386 MB, ".{0,10000}" 1.5 GB (2.6 s): the
// cost grows with the square of the positions.
// Unbounded *, + and ? cost nothing extra and cover long runs.

#ifndef MONARCH_CONFIG_FILE_REGEX_H_
#define MONARCH_CONFIG_FILE_REGEX_H_

#include <regex.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace monarch {

inline constexpr uint64_t kMaxRegexPositions = 4096;

class FileRegex {
 public:
  // InvalidArgument naming dataset.file_regex (and quoting at most 200
  // characters of the pattern) if it is malformed or too large to compile.
  static absl::StatusOr<std::unique_ptr<FileRegex>> Compile(const std::string& pattern);
  ~FileRegex();
  FileRegex(const FileRegex&) = delete;
  FileRegex& operator=(const FileRegex&) = delete;

  // Whether the whole of `name` matches. Thread-safe (regexec on a shared
  // compiled pattern is).
  bool Matches(const std::string& name) const;

 private:
  FileRegex() = default;
  regex_t regex_;
};

// An upper bound of the positions `pattern` compiles to once its bounded
// repetitions are copied out: every atom counts 1, X{m,n} counts n times X
// (m + 1 times for X{m,}), alternatives add up. Saturates at UINT64_MAX.
// Malformed patterns get some bound; regcomp() reports what is wrong.
uint64_t RegexExpandedPositions(absl::string_view pattern);

}  // namespace monarch

#endif  // MONARCH_CONFIG_FILE_REGEX_H_
