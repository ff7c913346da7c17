#include "common/environment.h"

#include <cctype>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace monarch {

absl::StatusOr<std::string> ExpandEnvironment(const std::string& text, absl::string_view key) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text[i] != '$') {
      out += text[i++];
      continue;
    }
    size_t start = i + 1, end;
    const bool braced = start < text.size() && text[start] == '{';
    if (braced) {
      end = text.find('}', ++start);
      if (end == std::string::npos)
        return absl::InvalidArgumentError(absl::StrCat(key, ": unterminated ${ in '", text, "'"));
    } else {
      end = start;
      while (end < text.size() &&
             (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_')) {
        ++end;
      }
    }
    const std::string name = text.substr(start, end - start);
    const char* value = name.empty() ? nullptr : std::getenv(name.c_str());
    if (value == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": environment variable '", name, "' in '", text, "' is not set"));
    }
    out += value;
    i = braced ? end + 1 : end;
  }
  return out;
}

}  // namespace monarch
