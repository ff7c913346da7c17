// bench_namespace: how long the namespace takes to build for 100k and 1M
// files (warm directory cache), against a bare readdir+fstatat walk of the
// same tree in the same run. Target: 1M files in at most 5 s.
//
// usage: bench_namespace DIR [counts...]   (default counts: 100000 1000000)
// The trees are created under DIR once (1000 files per directory) and kept,
// so reruns skip creation.

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "metadata/namespace.h"

namespace {

using Clock = std::chrono::steady_clock;

void MakeTree(const std::string& root, long count) {
  std::string marker = root + ".complete";  // Beside the tree, not in it.
  if (::access(marker.c_str(), F_OK) == 0) return;
  ::mkdir(root.c_str(), 0755);
  for (long i = 0; i < count; ++i) {
    std::string dir = root + "/d" + std::to_string(i / 1000);
    if (i % 1000 == 0) ::mkdir(dir.c_str(), 0755);
    std::string path = dir + "/sample_" + std::to_string(i) + ".jpg";
    int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::perror(path.c_str());
      std::exit(1);
    }
    ::close(fd);
  }
  ::close(::open(marker.c_str(), O_CREAT | O_WRONLY, 0644));
}

// The floor: visit every entry and stat it, record nothing.
long BareWalk(const std::string& path) {
  long files = 0;
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return 0;
  while (struct dirent* d = ::readdir(dir)) {
    if (d->d_name[0] == '.' && (d->d_name[1] == 0 || (d->d_name[1] == '.' && d->d_name[2] == 0)))
      continue;
    if (d->d_type == DT_DIR) {
      files += BareWalk(path + "/" + d->d_name);
    } else {
      struct stat st;
      if (::fstatat(::dirfd(dir), d->d_name, &st, 0) == 0) ++files;
    }
  }
  ::closedir(dir);
  return files;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_namespace DIR [counts...]\n");
    return 2;
  }
  std::vector<long> counts;
  for (int i = 2; i < argc; ++i) counts.push_back(std::atol(argv[i]));
  if (counts.empty()) counts = {100000, 1000000};
  ::mkdir(argv[1], 0755);
  for (long count : counts) {
    std::string root = std::string(argv[1]) + "/tree" + std::to_string(count);
    MakeTree(root, count);
    BareWalk(root);  // Warm the directory cache.
    for (int threads : {1, 8}) {
      double best_walk = 1e9, best_build = 1e9;
      for (int rep = 0; rep < 3; ++rep) {
        auto start = Clock::now();
        long walked = BareWalk(root);
        best_walk = std::min(best_walk, Seconds(start));
        start = Clock::now();
        auto ns = monarch::Namespace::Build(root, "", 1, threads);
        best_build = std::min(best_build, Seconds(start));
        if (!ns.ok() || (*ns)->file_count() != static_cast<uint32_t>(count) || walked != count) {
          std::fprintf(stderr, "wrong file count\n");
          return 1;
        }
      }
      std::printf(
          "namespace build, %ld files, %d thread(s): %.3f s (bare serial readdir+stat walk %.3f s, "
          "ratio %.2f)%s\n",
          count, threads, best_build, best_walk, best_build / best_walk,
          count >= 1000000
              ? (best_build <= 5.0 ? "  [target <= 5 s: met]" : "  [target <= 5 s: MISSED]")
              : "");
    }
  }
  return 0;
}
