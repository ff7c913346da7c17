// Glob implementation: walks the namespace level by level.

#include "frontend/glob.h"

#include <fnmatch.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_split.h"

namespace monarch::frontend {

std::vector<std::string> Glob(const Monarch& monarch, const DatasetPaths& paths,
                              std::string_view pattern) {
  // Split into components; the leading ones without wildcards are the fixed
  // directory the walk starts from.
  const std::vector<std::string> components =
      absl::StrSplit(absl::string_view(pattern.data(), pattern.size()), '/', absl::SkipEmpty());
  std::string fixed;
  size_t first_wild = 0;
  while (first_wild < components.size() &&
         components[first_wild].find_first_of("*?[\\") == std::string::npos) {
    fixed += "/" + components[first_wild++];
  }
  if (fixed.empty()) fixed = "/";

  std::vector<std::string> matches;
  std::string name;
  if (!paths.ToDatasetName(fixed, &name) ||
      !(monarch.FileExists(name) || monarch.IsDirectory(name))) {
    return matches;
  }
  // (dataset name, absolute path) pairs matching the components so far.
  std::vector<std::pair<std::string, std::string>> level = {{name, fixed}};
  for (size_t i = first_wild; i < components.size() && !level.empty(); ++i) {
    std::vector<std::pair<std::string, std::string>> next;
    for (const auto& [dir, dir_path] : level) {
      // Not a directory: nothing below it can match.
      absl::StatusOr<std::vector<std::string>> children = monarch.ListDirectory(dir);
      if (!children.ok()) continue;
      for (const std::string& child : *children) {
        if (::fnmatch(components[i].c_str(), child.c_str(), 0) != 0) continue;
        next.emplace_back(dir.empty() ? child : dir + "/" + child,
                          (dir_path == "/" ? "" : dir_path) + "/" + child);
      }
    }
    level = std::move(next);
  }
  for (auto& [unused, path] : level) matches.push_back(std::move(path));
  std::sort(matches.begin(), matches.end());
  return matches;
}

}  // namespace monarch::frontend
