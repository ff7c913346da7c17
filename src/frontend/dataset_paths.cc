// DatasetPaths implementation.

#include "frontend/dataset_paths.h"

#include <cstdlib>

#include "common/os.h"

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

DatasetPaths::DatasetPaths(std::string root)
    : root_(std::move(root)), real_root_(std::make_shared<RealRoot>()) {}

const std::string& DatasetPaths::real_root() const {
  absl::call_once(real_root_->once, [this] {
    if (char* real = os::RealPath(root_.c_str(), nullptr)) {
      if (root_ != real) real_root_->path = real;
      std::free(real);
    }
  });
  return real_root_->path;
}

bool DatasetPaths::ToDatasetNameAsGiven(std::string_view path, std::string* name) const {
  return StripRoot(path, root_, name);
}

bool DatasetPaths::ToDatasetName(std::string_view path, std::string* name) const {
  if (StripRoot(path, root_, name)) return true;
  const std::string& real = real_root();
  return !real.empty() && StripRoot(path, real, name);
}

}  // namespace monarch::frontend
