// Namespace: dataset walk and lock-free lookups.

#include "metadata/namespace.h"

#include <dirent.h>
#include <fcntl.h>
#include <regex.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace monarch {
namespace {

// POSIX extended regex, compiled once. Chosen over std::regex, which is
// several times slower per match and would dominate a million-file walk.
class NameFilter {
 public:
  absl::Status Compile(const std::string& pattern) {
    if (pattern.empty()) return absl::OkStatus();
    int rc = ::regcomp(&regex_, absl::StrCat("^(", pattern, ")$").c_str(),
                       REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
      char message[256];
      ::regerror(rc, &regex_, message, sizeof(message));
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.file_regex: invalid regular expression '", pattern, "': ", message));
    }
    compiled_ = true;
    return absl::OkStatus();
  }
  ~NameFilter() {
    if (compiled_) ::regfree(&regex_);
  }
  bool Keep(const std::string& name) const {
    return !compiled_ || ::regexec(&regex_, name.c_str(), 0, nullptr, 0) == 0;
  }

 private:
  regex_t regex_;
  bool compiled_ = false;
};

struct WalkedFile {
  size_t name_offset;
  uint32_t name_length;
  uint64_t size;
  int64_t mtime_ns;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Namespace>> Namespace::Build(const std::string& root,
                                                            const std::string& file_regex,
                                                            int source_tier) {
  NameFilter filter;
  MONARCH_RETURN_IF_ERROR(filter.Compile(file_regex));

  std::unique_ptr<Namespace> ns(new Namespace());
  ns->root_ = root;
  while (ns->root_.size() > 1 && ns->root_.back() == '/') ns->root_.pop_back();

  std::vector<WalkedFile> files;
  ns->directory_names_.push_back("");
  ns->directories_.emplace_back();
  std::string name;
  // Depth-first; each directory is read completely before its children, so
  // only one DIR stream is open at a time.
  std::vector<uint32_t> pending = {0};
  while (!pending.empty()) {
    uint32_t dir_index = pending.back();
    pending.pop_back();
    const std::string relative = ns->directory_names_[dir_index];
    const std::string path = relative.empty() ? ns->root_ : absl::StrCat(ns->root_, "/", relative);
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) {
      if (dir_index == 0) return ErrnoToStatus(errno, absl::StrCat("dataset.path: open ", path));
      MONARCH_LOG(kWarning, "skipping unreadable directory ", path, ": ", std::strerror(errno));
      continue;
    }
    const int dir_fd = ::dirfd(dir);
    while (struct dirent* d = ::readdir(dir)) {
      absl::string_view base = d->d_name;
      if (base == "." || base == "..") continue;
      name = relative.empty() ? std::string(base) : absl::StrCat(relative, "/", base);
      bool is_dir = d->d_type == DT_DIR;
      if (d->d_type == DT_REG && !filter.Keep(name)) continue;
      struct stat st;
      if (d->d_type != DT_DIR) {
        // Follows symlinks to files; a symlinked directory is skipped below
        // rather than followed, so a link cycle cannot trap the walk.
        if (::fstatat(dir_fd, d->d_name, &st, 0) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
          MONARCH_LOG(kInfo, "not following symlinked directory ", name);
          continue;
        }
        if (!S_ISREG(st.st_mode) || (d->d_type != DT_REG && !filter.Keep(name))) continue;
      }
      if (is_dir) {
        uint32_t child = static_cast<uint32_t>(ns->directory_names_.size());
        ns->directory_names_.push_back(name);
        ns->directories_.emplace_back();
        ns->directories_[dir_index].subdirectories.push_back(child);
        pending.push_back(child);
        continue;
      }
      uint32_t id = static_cast<uint32_t>(files.size());
      files.push_back({ns->names_.size(), static_cast<uint32_t>(name.size()),
                       static_cast<uint64_t>(st.st_size),
                       static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
      ns->names_.append(name);
      ns->directories_[dir_index].files.push_back(id);
    }
    ::closedir(dir);
  }

  // The arena is complete: views into it stay valid from here on.
  ns->file_count_ = static_cast<uint32_t>(files.size());
  ns->entries_ = std::make_unique<FileEntry[]>(files.size());
  ns->by_name_.reserve(files.size());
  for (uint32_t id = 0; id < files.size(); ++id) {
    FileEntry& entry = ns->entries_[id];
    entry.ref.id = id;
    entry.ref.name = absl::string_view(ns->names_).substr(files[id].name_offset,
                                                          files[id].name_length);
    entry.ref.size = files[id].size;
    entry.ref.mtime_ns = files[id].mtime_ns;
    entry.tier.store(source_tier, std::memory_order_relaxed);
    ns->total_bytes_ += files[id].size;
    ns->by_name_.emplace(entry.ref.name, id);
  }
  for (uint32_t i = 0; i < ns->directory_names_.size(); ++i) {
    ns->directory_by_name_.emplace(ns->directory_names_[i], i);
  }
  return ns;
}

bool Namespace::Canonicalize(absl::string_view name, std::string* scratch,
                             absl::string_view* out) const {
  if (name == "/") name = "";  // The dataset root, as front ends spell it.
  if (!name.empty() && name[0] == '/') {
    if (!absl::StartsWith(name, root_)) return false;
    name.remove_prefix(root_.size());
    if (!name.empty() && name[0] != '/' && root_ != "/") return false;  // "/data2" vs "/data".
  }
  // Fast path: already canonical.
  bool clean = name.find("//") == absl::string_view::npos && !absl::StartsWith(name, "/") &&
               !absl::StartsWith(name, "./") && !absl::EndsWith(name, "/") &&
               name.find("/./") == absl::string_view::npos && name != ".";
  if (clean) {
    *out = name;
    return true;
  }
  scratch->clear();
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == absl::string_view::npos) end = name.size();
    absl::string_view part = name.substr(start, end - start);
    if (part == "..") return false;  // Never resolve out of the dataset.
    if (!part.empty() && part != ".") {
      if (!scratch->empty()) scratch->push_back('/');
      scratch->append(part.data(), part.size());
    }
    start = end + 1;
  }
  *out = *scratch;
  return true;
}

FileEntry* Namespace::Find(absl::string_view name) const {
  std::string scratch;
  absl::string_view canonical;
  if (!Canonicalize(name, &scratch, &canonical)) return nullptr;
  auto it = by_name_.find(canonical);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

const Namespace::Directory* Namespace::FindDirectory(absl::string_view name) const {
  std::string scratch;
  absl::string_view canonical;
  if (!Canonicalize(name, &scratch, &canonical)) return nullptr;
  auto it = directory_by_name_.find(canonical);
  return it == directory_by_name_.end() ? nullptr : &directories_[it->second];
}

bool Namespace::IsDirectory(absl::string_view name) const { return FindDirectory(name) != nullptr; }

absl::StatusOr<std::vector<std::string>> Namespace::List(absl::string_view dir) const {
  const Directory* directory = FindDirectory(dir);
  if (directory == nullptr) {
    return absl::NotFoundError(absl::StrCat("not a dataset directory: ", dir));
  }
  std::vector<std::string> names;
  names.reserve(directory->files.size() + directory->subdirectories.size());
  auto base_name = [](absl::string_view path) {
    size_t slash = path.find_last_of('/');
    return std::string(slash == absl::string_view::npos ? path : path.substr(slash + 1));
  };
  for (uint32_t id : directory->files) names.push_back(base_name(entries_[id].ref.name));
  for (uint32_t sub : directory->subdirectories) names.push_back(base_name(directory_names_[sub]));
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace monarch
