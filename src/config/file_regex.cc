#include "config/file_regex.h"

#include <cstdlib>
#include <limits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace monarch {
namespace {

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max()
                                                      : a + b;
}

uint64_t SaturatingMultiply(uint64_t a, uint64_t b) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) {
    return std::numeric_limits<uint64_t>::max();
  }
  return a * b;
}

// Parses a decimal count at pattern[*i]; advances *i past it. Large counts
// saturate (regcomp refuses anything past RE_DUP_MAX anyway).
bool ParseCount(absl::string_view pattern, size_t* i, uint64_t* count) {
  const size_t start = *i;
  *count = 0;
  while (*i < pattern.size() && absl::ascii_isdigit(static_cast<unsigned char>(pattern[*i]))) {
    *count = SaturatingAdd(SaturatingMultiply(*count, 10), static_cast<uint64_t>(pattern[*i] - '0'));
    ++*i;
  }
  return *i > start;
}

// A bound "{m}", "{m,}" or "{m,n}" at pattern[*i] (the '{'): the number of
// copies of the preceding atom it stands for. Advances *i past it. glibc
// also takes "{,n}" and "{,}" (m omitted: 0), which count the same way.
bool ParseBound(absl::string_view pattern, size_t* i, uint64_t* copies) {
  size_t j = *i + 1;
  uint64_t low = 0;
  uint64_t high = 0;
  const bool no_low = j < pattern.size() && pattern[j] == ',';
  if (!no_low && !ParseCount(pattern, &j, &low)) return false;
  if (j < pattern.size() && pattern[j] == '}') {
    *copies = low;
  } else if (j < pattern.size() && pattern[j] == ',') {
    ++j;
    if (j < pattern.size() && pattern[j] == '}') {
      *copies = SaturatingAdd(low, 1);  // X{m,} is m copies and a starred one.
    } else if (ParseCount(pattern, &j, &high) && j < pattern.size() && pattern[j] == '}') {
      *copies = high > low ? high : low;
    } else {
      return false;
    }
  } else {
    return false;
  }
  *i = j + 1;
  return true;
}

// Skips a bracket expression "[...]" starting at pattern[i] (the '['), with
// its special cases: a leading ']' (or "^]") is a member, and "[:alpha:]",
// "[.x.]", "[=x=]" may hold a ']'. Returns the index past it.
size_t SkipBracket(absl::string_view pattern, size_t i) {
  ++i;
  if (i < pattern.size() && pattern[i] == '^') ++i;
  if (i < pattern.size() && pattern[i] == ']') ++i;
  while (i < pattern.size() && pattern[i] != ']') {
    if (pattern[i] == '[' && i + 1 < pattern.size() &&
        (pattern[i + 1] == ':' || pattern[i + 1] == '.' || pattern[i + 1] == '=')) {
      const char close = pattern[i + 1];
      size_t j = i + 2;
      while (j + 1 < pattern.size() && !(pattern[j] == close && pattern[j + 1] == ']')) ++j;
      i = j + 2;
      continue;
    }
    ++i;
  }
  return i + 1;
}

// Whether `pattern` has a ')' closing no '(' of its own. The pattern is
// compiled inside "^(...)$": such a ')' would close that group instead,
// unanchoring what follows (and repeating the whole pattern before it, which
// the size bound does not see).
bool ClosesUnopenedGroup(absl::string_view pattern) {
  int depth = 0;
  for (size_t i = 0; i < pattern.size();) {
    const char c = pattern[i];
    if (c == '\\') {
      i += 2;
    } else if (c == '[') {
      i = SkipBracket(pattern, i);
    } else {
      if (c == '(') ++depth;
      if (c == ')' && --depth < 0) return true;
      ++i;
    }
  }
  return false;
}

// Whether `pattern` applies a repetition (?, *, +, {m,n}) to something that
// can already match the empty string: "x??", "(x?)?", "(x*)*", "(a|){9}".
// POSIX leaves stacked repetitions undefined, and glibc's regcomp takes time
// and memory far beyond the pattern's size on them once repeated (the config
// fuzzer: "p?????????????{200}" ran out of 24 GiB; "((p*)*){100}" took over
// 20 s), which the size bound does not see.
bool RepeatsNullable(absl::string_view pattern) {
  // Per open group: whether its branch so far can match nothing, whether an
  // earlier branch could, and the last atom (what a repetition applies to):
  // whether it can, and whether the branch before it could.
  struct Frame {
    bool branch_nullable = true;
    bool some_branch_nullable = false;
    bool has_last = false;
    bool last_nullable = false;
    bool before_last_nullable = true;
  };
  std::vector<Frame> frames(1);
  auto set_last = [](Frame& frame, bool nullable) {
    frame.last_nullable = nullable;
    frame.branch_nullable = frame.before_last_nullable && nullable;
  };
  auto atom = [&](bool nullable) {
    Frame& frame = frames.back();
    frame.before_last_nullable = frame.branch_nullable;
    frame.has_last = true;
    set_last(frame, nullable);
  };
  for (size_t i = 0; i < pattern.size();) {
    const char c = pattern[i];
    Frame& frame = frames.back();
    if (c == '\\') {
      atom(false);
      i += 2;
    } else if (c == '[') {
      atom(false);
      i = SkipBracket(pattern, i);
    } else if (c == '(') {
      frames.emplace_back();
      ++i;
    } else if (c == ')' && frames.size() > 1) {
      const bool nullable = frame.branch_nullable || frame.some_branch_nullable;
      frames.pop_back();
      atom(nullable);
      ++i;
    } else if (c == '|') {
      frame.some_branch_nullable = frame.some_branch_nullable || frame.branch_nullable;
      frame.branch_nullable = true;
      frame.has_last = false;
      ++i;
    } else if ((c == '?' || c == '*' || c == '+' || c == '{') && frame.has_last) {
      bool makes_nullable = c == '?' || c == '*';
      if (c == '{') {
        size_t end = i, low_end = i + 1;
        uint64_t copies = 0, low = 0;
        if (!ParseBound(pattern, &end, &copies)) {  // Not a bound: a literal brace.
          atom(false);
          ++i;
          continue;
        }
        // "{,n}" (glibc) and "{0...}" can repeat nothing.
        makes_nullable = !ParseCount(pattern, &low_end, &low) || low == 0;
        i = end;
      } else {
        ++i;
      }
      if (frame.last_nullable) return true;
      if (makes_nullable) set_last(frame, true);
    } else {
      atom(false);
      ++i;
    }
  }
  return false;
}

}  // namespace

uint64_t RegexExpandedPositions(absl::string_view pattern) {
  // One frame per open group: the positions so far, and those of the last
  // atom (what a following repetition copies; 0 after '|' or at the start).
  struct Frame {
    uint64_t total = 0;
    uint64_t last = 0;
  };
  std::vector<Frame> frames(1);
  auto add_atom = [&](uint64_t positions) {
    frames.back().total = SaturatingAdd(frames.back().total, positions);
    frames.back().last = positions;
  };
  auto repeat_last = [&](uint64_t copies) {
    Frame& frame = frames.back();
    const uint64_t repeated = SaturatingMultiply(frame.last, copies);
    frame.total = SaturatingAdd(frame.total - frame.last, repeated);
    frame.last = repeated;
  };
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\') {
      add_atom(1);
      i += 2;
    } else if (c == '[') {
      add_atom(1);
      i = SkipBracket(pattern, i);
    } else if (c == '(') {
      frames.emplace_back();
      ++i;
    } else if (c == ')' && frames.size() > 1) {
      const uint64_t group = frames.back().total > 0 ? frames.back().total : 1;
      frames.pop_back();
      add_atom(group);
      ++i;
    } else if (c == '|') {
      frames.back().last = 0;
      ++i;
    } else if (c == '{') {
      uint64_t copies = 0;
      if (frames.back().last > 0 && ParseBound(pattern, &i, &copies)) {
        repeat_last(copies > 0 ? copies : 1);
      } else {
        add_atom(1);
        ++i;
      }
    } else if (c == '+') {
      repeat_last(2);  // X+ compiles as X X*.
      ++i;
    } else if (c == '*' || c == '?') {
      ++i;
    } else {
      add_atom(1);
      ++i;
    }
  }
  // Unclosed groups: regcomp reports them; count what they hold.
  uint64_t total = 0;
  for (const Frame& frame : frames) total = SaturatingAdd(total, frame.total);
  return total;
}

absl::StatusOr<std::unique_ptr<FileRegex>> FileRegex::Compile(const std::string& pattern) {
  if (ClosesUnopenedGroup(pattern)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.file_regex: ", QuoteForError(pattern),
        " has a ')' that closes no '('; write \\) to match a parenthesis"));
  }
  if (RepeatsNullable(pattern)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.file_regex: ", QuoteForError(pattern),
        " repeats something that can already match nothing (as in 'x?\?', '(x?)?', '(x*)*' "
        "or '(a|){3}'): POSIX leaves that undefined and regcomp can take gigabytes on it; "
        "use a single repetition"));
  }
  const uint64_t positions = RegexExpandedPositions(pattern);
  if (positions > kMaxRegexPositions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.file_regex: ", QuoteForError(pattern),
        " is too large to compile: its bounded repetitions ({m,n}) expand to ",
        positions == std::numeric_limits<uint64_t>::max() ? std::string("too many")
                                                           : absl::StrCat(positions),
        " positions, more than ", kMaxRegexPositions,
        "; use *, + or smaller bounds"));
  }
  regex_t regex;
  const int rc =
      ::regcomp(&regex, absl::StrCat("^(", pattern, ")$").c_str(), REG_EXTENDED | REG_NOSUB);
  if (rc != 0) {
    char message[256];
    ::regerror(rc, &regex, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.file_regex: invalid regular expression ", QuoteForError(pattern), ": ", message));
  }
  // A regex_t owns heap pointers and nothing that points into itself, so
  // the compiled one moves by copy; this object now frees it.
  std::unique_ptr<FileRegex> compiled(new FileRegex());
  compiled->regex_ = regex;
  return compiled;
}

FileRegex::~FileRegex() { ::regfree(&regex_); }

bool FileRegex::Matches(const std::string& name) const {
  return ::regexec(&regex_, name.c_str(), 0, nullptr, 0) == 0;
}

}  // namespace monarch
