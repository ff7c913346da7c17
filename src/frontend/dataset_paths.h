// DatasetPaths: maps the absolute paths a program uses to dataset names.
//
// Front ends see paths ("/lustre/imagenet/train/a.jpg"); Monarch serves
// dataset-relative names ("train/a.jpg"; "" is the root). A dataset given
// through a symlink is reached by both spellings, its own and its realpath.
//
// The realpath is taken on the first path that does not match the root as
// given: a client of a node service must open without a metadata operation
// on the PFS. Thread-safe; copies share the lazily resolved spelling.

#ifndef MONARCH_FRONTEND_DATASET_PATHS_H_
#define MONARCH_FRONTEND_DATASET_PATHS_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/base/call_once.h"

namespace monarch::frontend {

class DatasetPaths {
 public:
  // `root`: the dataset directory as Monarch reports it (absolute, no
  // trailing slash). Its realpath is taken once, when first needed.
  explicit DatasetPaths(std::string root);

  // If `path` (absolute, already clean: no "//", "." or "..") is the root or
  // below it, sets `name` to the rest and returns true.
  bool ToDatasetName(std::string_view path, std::string* name) const;
  // The same against the root as given only: never takes the realpath (for
  // paths a program spelled itself, which are mostly not the dataset's).
  bool ToDatasetNameAsGiven(std::string_view path, std::string* name) const;

  const std::string& root() const { return root_; }

 private:
  struct RealRoot {
    absl::once_flag once;
    std::string path;  // Empty unless it differs from the root.
  };
  const std::string& real_root() const;

  std::string root_;
  std::shared_ptr<RealRoot> real_root_;
};

}  // namespace monarch::frontend

#endif  // MONARCH_FRONTEND_DATASET_PATHS_H_
