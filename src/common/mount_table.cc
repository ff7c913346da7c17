// Parsing /proc/self/mountinfo.

#include "common/mount_table.h"

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace monarch {
namespace {

// A mountinfo path with its octal escapes (\040 for a space) decoded.
std::string Unescape(absl::string_view field) {
  auto octal = [](char c) { return c >= '0' && c <= '7'; };
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && field[i + 1] <= '3' && octal(field[i + 1]) &&
        octal(field[i + 2]) && octal(field[i + 3])) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                               (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

}  // namespace

std::vector<MountEntry> ParseMountinfo(absl::string_view text) {
  std::vector<MountEntry> mounts;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> halves = absl::StrSplit(line, absl::MaxSplits(" - ", 1));
    if (halves.size() != 2) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(halves[0], ' ');
    std::vector<absl::string_view> tail = absl::StrSplit(halves[1], ' ');
    if (fields.size() < 6 || tail.size() < 3) continue;
    MountEntry entry;
    entry.root = Unescape(fields[3]);
    entry.mount_point = Unescape(fields[4]);
    entry.fs_type = std::string(tail[0]);
    for (absl::string_view option : absl::StrSplit(tail[2], ',')) {
      entry.super_options.emplace_back(option);
    }
    mounts.push_back(std::move(entry));
  }
  return mounts;
}

bool MountHolds(absl::string_view mount, absl::string_view path) {
  if (mount == "/") return absl::StartsWith(path, "/");
  return absl::StartsWith(path, mount) &&
         (path.size() == mount.size() || path[mount.size()] == '/');
}

}  // namespace monarch
