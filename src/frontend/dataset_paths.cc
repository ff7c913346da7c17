// DatasetPaths implementation.

#include "frontend/dataset_paths.h"

#include <cstdlib>

namespace monarch::frontend {
namespace {

bool StripRoot(std::string_view path, std::string_view root, std::string* name) {
  if (root == "/") {  // Everything absolute is inside a dataset rooted at "/".
    if (path.empty() || path[0] != '/') return false;
    name->assign(path.substr(1));
    return true;
  }
  if (path.size() < root.size() || path.compare(0, root.size(), root) != 0) return false;
  if (path.size() == root.size()) {
    name->clear();
    return true;
  }
  if (path[root.size()] != '/') return false;  // "/data/set2" is not in "/data/set".
  name->assign(path.substr(root.size() + 1));
  return true;
}

}  // namespace

DatasetPaths::DatasetPaths(std::string root) : root_(std::move(root)) {
  if (char* real = ::realpath(root_.c_str(), nullptr)) {
    if (root_ != real) real_root_ = real;
    std::free(real);
  }
}

bool DatasetPaths::ToDatasetName(std::string_view path, std::string* name) const {
  return StripRoot(path, root_, name) ||
         (!real_root_.empty() && StripRoot(path, real_root_, name));
}

}  // namespace monarch::frontend
