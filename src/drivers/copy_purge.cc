// PurgeCopyTree: the walk that removes a file tier's copies and nothing else.

#include "drivers/copy_purge.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/os.h"
#include "common/status_macros.h"
#include "drivers/copy_integrity.h"
#include "drivers/copy_tree.h"

namespace monarch {
namespace {

// Deeper than any dataset we know of; a bound on the descriptors the walk
// holds open (one per level).
constexpr int kMaxDepth = 128;

// The names in the directory open at `fd` (which stays open), "." and ".."
// left out. Read whole before anything is removed, so that removing entries
// cannot disturb the listing.
absl::StatusOr<std::vector<std::string>> ListDirectory(int fd, const std::string& path) {
  // fdopendir takes over the descriptor it is given: a duplicate. (os.h has
  // no fdopendir; the directory is already open through the seam.)
  ScopedFd copy(os::Dup(fd));
  if (!copy.valid()) return ErrnoToStatus(errno, absl::StrCat("dup ", path));
  // The duplicate shares the directory's offset, which an earlier listing
  // left at its end.
  if (os::Lseek(copy.get(), 0, SEEK_SET) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("rewind ", path));
  }
  DIR* dir = ::fdopendir(copy.get());
  if (dir == nullptr) return ErrnoToStatus(errno, absl::StrCat("opendir ", path));
  copy.release();  // The DIR's now.
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* entry = os::ReadDir(dir)) {
    const absl::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
    errno = 0;
  }
  const int error = errno;
  os::CloseDir(dir);
  if (error != 0) return ErrnoToStatus(error, absl::StrCat("readdir ", path));
  return names;
}

class Purge {
 public:
  Purge(const std::string& root, dev_t device, const PurgeOptions& options)
      : root_(root), device_(device), options_(options) {}

  const PurgeReport& report() const { return report_; }

  // What a walk of one directory found.
  struct Outcome {
    bool removed_any = false;  // Something below was removed (or would be).
    bool left_any = false;     // Something below stays.
  };
  // A directory left as it is (it could not be opened or listed).
  static Outcome LeftAlone() { return Outcome{/*removed_any=*/false, /*left_any=*/true}; }

  // Walks the directory open at `fd` (`relative` to the root, "" for the
  // root itself).
  Outcome Walk(int fd, const std::string& relative, int depth) {
    std::optional<std::vector<std::string>> names = List(fd, relative);
    if (!names) return LeftAlone();
    Outcome outcome;
    for (const std::string& name : *names) {
      const std::string child = relative.empty() ? name : absl::StrCat(relative, "/", name);
      struct stat st;
      if (os::FstatAt(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        const int error = errno;
        if (error == ENOENT) continue;  // Removed since the listing.
        Error(error, "stat", child);
        outcome.left_any = true;
        continue;
      }
      if (S_ISLNK(st.st_mode)) {
        ++report_.symlinks;
        outcome.left_any = true;
      } else if (S_ISDIR(st.st_mode)) {
        const bool reserved = relative.empty() && name == CopyTree::kReservedDirectory;
        Merge(reserved ? WalkReserved(fd, name, st) : Descend(fd, child, name, st, depth),
              &outcome);
      } else if (S_ISREG(st.st_mode) && IsCopy(fd, name, child, st)) {
        Remove(fd, name, child, st, /*temporary=*/false, &outcome);
      } else {
        // A user's file, a copy cut short by a crash, a FIFO, a socket: not
        // provably Monarch's, so it stays.
        ++report_.foreign_files;
        outcome.left_any = true;
      }
    }
    return outcome;
  }

 private:
  std::string PathOf(const std::string& relative) const {
    return relative.empty() ? root_ : JoinPath(root_, relative);
  }

  void Error(int error, absl::string_view what, const std::string& relative) {
    report_.errors.push_back(
        absl::StrCat(what, " ", PathOf(relative), ": ", std::strerror(error)));
  }

  // The names in the directory open at `fd`; none, the error reported, if
  // it cannot be listed.
  std::optional<std::vector<std::string>> List(int fd, const std::string& relative) {
    absl::StatusOr<std::vector<std::string>> names = ListDirectory(fd, PathOf(relative));
    if (names.ok()) return *std::move(names);
    report_.errors.emplace_back(names.status().message());
    return std::nullopt;
  }

  static void Merge(const Outcome& from, Outcome* into) {
    into->removed_any = into->removed_any || from.removed_any;
    into->left_any = into->left_any || from.left_any;
  }

  // Opens the subdirectory `name` of `fd` without following a symlink (one
  // swapped in since the fstatat is refused, not followed).
  ScopedFd OpenDirectory(int fd, const std::string& name, const std::string& relative,
                         const struct stat& st) {
    ScopedFd dir(os::OpenAt(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.valid()) {
      Error(errno, "open", relative);
      return ScopedFd();
    }
    struct stat opened;
    if (os::Fstat(dir.get(), &opened) != 0 || opened.st_dev != st.st_dev ||
        opened.st_ino != st.st_ino) {
      report_.errors.push_back(
          absl::StrCat(PathOf(relative), ": replaced during the purge; left alone"));
      return ScopedFd();
    }
    return dir;
  }

  Outcome Descend(int fd, const std::string& relative, const std::string& name,
                  const struct stat& st, int depth) {
    Outcome outcome;
    outcome.left_any = true;
    // Another file system mounted under the tier is not the tier's.
    if (st.st_dev != device_) {
      ++report_.mount_points;
      return outcome;
    }
    if (depth >= kMaxDepth) {
      report_.errors.push_back(absl::StrCat(PathOf(relative), ": more than ", kMaxDepth,
                                            " directories deep; not entered"));
      return outcome;
    }
    ScopedFd dir = OpenDirectory(fd, name, relative, st);
    if (!dir.valid()) return outcome;
    outcome = Walk(dir.get(), relative, depth + 1);
    dir = ScopedFd();
    // Only a directory the purge emptied goes (it held copies, so Monarch
    // made it or shares it with nothing else); an empty one of the user's
    // stays. Under ".monarch/extents" every directory is Monarch's.
    if ((outcome.removed_any || in_extents_) && !outcome.left_any) {
      RemoveDirectory(fd, name, relative, &outcome);
    } else {
      outcome.left_any = true;  // The directory itself stays.
    }
    return outcome;
  }

  void RemoveDirectory(int fd, const std::string& name, const std::string& relative,
                       Outcome* outcome) {
    if (!options_.dry_run && os::UnlinkAt(fd, name.c_str(), AT_REMOVEDIR) != 0) {
      Error(errno, "rmdir", relative);
      outcome->left_any = true;
      return;
    }
    ++report_.directories;
  }

  // "<root>/.monarch": Monarch's own, holding "tmp/" and its temporaries,
  // and "extents/", the copies of extents.
  Outcome WalkReserved(int root_fd, const std::string& name, const struct stat& st) {
    ScopedFd reserved = OpenDirectory(root_fd, name, name, st);
    if (!reserved.valid()) return LeftAlone();
    std::optional<std::vector<std::string>> entries = List(reserved.get(), name);
    if (!entries) return LeftAlone();
    Outcome outcome;
    const absl::string_view tmp =
        CopyTree::kTemporaryDirectory.substr(CopyTree::kReservedDirectory.size() + 1);
    bool left = false;
    for (const std::string& entry : *entries) {
      struct stat tmp_st;
      if (entry == CopyTree::kExtentsDirectory &&
          os::FstatAt(reserved.get(), entry.c_str(), &tmp_st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISDIR(tmp_st.st_mode)) {
        // Copies of extents, in a tree named after the files: as the copies.
        in_extents_ = true;
        Outcome extents =
            Descend(reserved.get(), absl::StrCat(name, "/", entry), entry, tmp_st, 1);
        in_extents_ = false;
        Merge(extents, &outcome);
        left = left || extents.left_any;
        continue;
      }
      if (entry != tmp || os::FstatAt(reserved.get(), entry.c_str(), &tmp_st,
                                      AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISDIR(tmp_st.st_mode)) {
        ++report_.foreign_files;  // Not ours, even in our directory: kept.
        left = true;
        continue;
      }
      const std::string relative = std::string(CopyTree::kTemporaryDirectory);
      Outcome temporaries = WalkTemporaries(reserved.get(), entry, relative, tmp_st);
      Merge(temporaries, &outcome);
      if (temporaries.left_any) {
        left = true;
      } else {
        // Monarch made it (CopyTree::NewTemporary): it goes even if empty.
        Outcome removed;
        RemoveDirectory(reserved.get(), entry, relative, &removed);
        left = left || removed.left_any;
      }
    }
    reserved = ScopedFd();
    if (!left) {
      Outcome removed;
      RemoveDirectory(root_fd, name, name, &removed);
      left = removed.left_any;
    }
    outcome.left_any = left;
    return outcome;
  }

  Outcome WalkTemporaries(int fd, const std::string& name, const std::string& relative,
                          const struct stat& st) {
    ScopedFd dir = OpenDirectory(fd, name, relative, st);
    if (!dir.valid()) return LeftAlone();
    std::optional<std::vector<std::string>> entries = List(dir.get(), relative);
    if (!entries) return LeftAlone();
    Outcome outcome;
    for (const std::string& entry : *entries) {
      const std::string child = absl::StrCat(relative, "/", entry);
      struct stat entry_st;
      const pid_t owner = TemporaryOwner(entry);
      if (os::FstatAt(dir.get(), entry.c_str(), &entry_st, AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISREG(entry_st.st_mode) || owner == 0) {
        ++report_.foreign_files;
        outcome.left_any = true;
      } else if (ProcessAlive(owner)) {
        // A process writing a copy into this tier right now (a Monarch in
        // process, node.shared: false, which the service's lock does not
        // cover); its temporary is its own to delete.
        ++report_.live_temporaries;
        outcome.left_any = true;
      } else {
        Remove(dir.get(), entry, child, entry_st, /*temporary=*/true, &outcome);
      }
    }
    return outcome;
  }

  // Whether the regular file `name` in `fd` carries an intact copy trailer.
  // Opened without following a symlink and without blocking (a FIFO swapped
  // in since the fstatat), and only if it is still the file stat'ed.
  bool IsCopy(int fd, const std::string& name, const std::string& relative,
              const struct stat& st) {
    ScopedFd file(os::OpenAt(fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!file.valid()) {
      if (errno != ENOENT) Error(errno, "open", relative);
      return false;
    }
    struct stat opened;
    if (os::Fstat(file.get(), &opened) != 0 || !S_ISREG(opened.st_mode) ||
        opened.st_dev != st.st_dev || opened.st_ino != st.st_ino) {
      return false;
    }
    return ReadCopyRecord(file.get(), static_cast<uint64_t>(opened.st_size), PathOf(relative))
        .ok();
  }

  void Remove(int fd, const std::string& name, const std::string& relative,
              const struct stat& st, bool temporary, Outcome* outcome) {
    if (!options_.dry_run && os::UnlinkAt(fd, name.c_str(), 0) != 0) {
      if (errno != ENOENT) {  // Gone already is what we wanted.
        Error(errno, "unlink", relative);
        outcome->left_any = true;
        return;
      }
    }
    const uint64_t bytes = static_cast<uint64_t>(st.st_size);
    if (temporary) {
      ++report_.temporaries;
      report_.temporary_bytes += bytes;
    } else {
      ++report_.copies;
      report_.copy_bytes += bytes;
    }
    outcome->removed_any = true;
    if (options_.on_file) options_.on_file(PathOf(relative), bytes);
  }

  const std::string root_;
  const dev_t device_;
  const PurgeOptions& options_;
  PurgeReport report_;
  bool in_extents_ = false;  // Walking ".monarch/extents", where every directory is ours.
};

}  // namespace

absl::StatusOr<PurgeReport> PurgeCopyTree(const std::string& root, const PurgeOptions& options) {
  // The root is followed if it is a symlink: it is the directory the config
  // names, the one the tier writes into. Nothing below it is.
  ScopedFd fd(os::Open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    const int error = errno;
    if (error == ENOTDIR) {
      return absl::FailedPreconditionError(absl::StrCat("'", root, "' is not a directory"));
    }
    return ErrnoToStatus(error, absl::StrCat("tier directory '", root, "'"));
  }
  struct stat st;
  if (os::Fstat(fd.get(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("stat tier directory '", root, "'"));
  }
  // Unreadable (no read or search permission): refused as a whole, so that
  // the caller names the tier rather than a purge that found nothing.
  MONARCH_RETURN_IF_ERROR(ListDirectory(fd.get(), root).status());
  Purge purge(root, st.st_dev, options);
  purge.Walk(fd.get(), "", 0);
  return purge.report();
}

}  // namespace monarch
