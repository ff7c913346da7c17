// DatasetPaths: maps the absolute paths a program uses to dataset names.
//
// Front ends see paths ("/lustre/imagenet/train/a.jpg"); Monarch serves
// dataset-relative names ("train/a.jpg"; "" is the root). A dataset given
// through a symlink is reached by both spellings, its own and its realpath.
//
// Immutable after construction; thread-safe.

#ifndef MONARCH_FRONTEND_DATASET_PATHS_H_
#define MONARCH_FRONTEND_DATASET_PATHS_H_

#include <string>
#include <string_view>

namespace monarch::frontend {

class DatasetPaths {
 public:
  // `root`: the dataset directory as Monarch reports it (absolute, no
  // trailing slash). Its realpath is taken once, here.
  explicit DatasetPaths(std::string root);

  // If `path` (absolute, already clean: no "//", "." or "..") is the root or
  // below it, sets `name` to the rest and returns true.
  bool ToDatasetName(std::string_view path, std::string* name) const;

  const std::string& root() const { return root_; }

 private:
  std::string root_;
  std::string real_root_;  // Empty unless it differs from root_.
};

}  // namespace monarch::frontend

#endif  // MONARCH_FRONTEND_DATASET_PATHS_H_
