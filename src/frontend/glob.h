// Glob over the dataset's namespace, for front ends that offer one.
//
// Why not the file system's glob: the namespace is in memory, so a pattern
// over millions of files costs no PFS metadata operation, and errors (a bad
// config) surface instead of "no match".
//
// Thread-safe (the namespace never changes).

#ifndef MONARCH_FRONTEND_GLOB_H_
#define MONARCH_FRONTEND_GLOB_H_

#include <string>
#include <string_view>
#include <vector>

#include "frontend/dataset_paths.h"
#include "monarch/monarch.h"

namespace monarch::frontend {

// The absolute paths of dataset files and directories matching `pattern`
// (absolute; fnmatch() semantics per '/'-separated component, as glob(3)),
// sorted. A pattern outside the dataset matches nothing.
std::vector<std::string> Glob(const Monarch& monarch, const DatasetPaths& paths,
                              std::string_view pattern);

}  // namespace monarch::frontend

#endif  // MONARCH_FRONTEND_GLOB_H_
