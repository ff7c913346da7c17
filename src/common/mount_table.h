// The mounts a process sees, from the text of /proc/self/mountinfo: where
// the cgroup hierarchy lies (memory_pressure.cc) and what page size a
// tmpfs gives (drivers/ram_keep.cc) are both read from it.

#ifndef MONARCH_COMMON_MOUNT_TABLE_H_
#define MONARCH_COMMON_MOUNT_TABLE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace monarch {

// One line of mountinfo: "id parent major:minor root mount-point options
// [optional fields] - fstype source super-options".
struct MountEntry {
  std::string root;         // Of the file system, shown at mount_point.
  std::string mount_point;  // Octal escapes (\040 for a space) decoded.
  std::string fs_type;
  std::vector<std::string> super_options;  // "rw", "size=...", "huge=...".
};

// Every line of `text` that parses, in its order (a later mount at the same
// point lies on top of an earlier one).
std::vector<MountEntry> ParseMountinfo(absl::string_view text);

// Whether mount point `mount` holds `path`: it is `path` or a parent of it.
bool MountHolds(absl::string_view mount, absl::string_view path);

}  // namespace monarch

#endif  // MONARCH_COMMON_MOUNT_TABLE_H_
