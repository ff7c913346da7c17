// Tests of what every front end shares (src/frontend/): path mapping, glob
// over the namespace, and the process-wide instance opened from the
// environment (each case in a forked child, since it is one per process).

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>

#include "absl/strings/match.h"
#include "frontend/dataset_paths.h"
#include "frontend/glob.h"
#include "api/process_instance.h"
#include "monarch/monarch.h"
#include "test_util.h"

namespace monarch {
namespace {

using frontend::DatasetPaths;
using testing::ScratchDir;

TEST_CASE("dataset paths: the root, below it, not beside it, and through a symlink") {
  ScratchDir dir;
  const std::string root = dir.Sub("data/set");
  dir.Sub("data/set2");
  const std::string link = dir.path() + "/link";
  REQUIRE(::symlink(root.c_str(), link.c_str()) == 0);
  DatasetPaths paths(link);
  std::string name;
  CHECK(paths.ToDatasetName(link, &name));
  CHECK(name.empty());
  CHECK(paths.ToDatasetName(link + "/a/b.jpg", &name));
  CHECK(name == "a/b.jpg");
  CHECK(paths.ToDatasetName(root + "/a/b.jpg", &name));  // The realpath spelling.
  CHECK(name == "a/b.jpg");
  CHECK_FALSE(paths.ToDatasetName(dir.path() + "/data/set2/a", &name));
  CHECK_FALSE(paths.ToDatasetName(link + "x/a", &name));
  CHECK_FALSE(paths.ToDatasetName("relative/a", &name));
  DatasetPaths slash("/");
  CHECK(slash.ToDatasetName("/etc/hosts", &name));
  CHECK(name == "etc/hosts");
}

TEST_CASE("glob matches the namespace component by component, sorted, absolute") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  testing::WriteFile(ds + "/train/a1.rec", 1, 10);
  testing::WriteFile(ds + "/train/a2.rec", 2, 10);
  testing::WriteFile(ds + "/train/b1.txt", 3, 10);
  testing::WriteFile(ds + "/val/deep/a3.rec", 4, 10);
  auto m = Monarch::Create(testing::MakeConfig(ds, {testing::RamTier(1 << 20)}));
  REQUIRE(m.ok());
  DatasetPaths paths((*m)->dataset_root());
  using V = std::vector<std::string>;
  CHECK(frontend::Glob(**m, paths, ds + "/train/a*.rec") ==
        V{ds + "/train/a1.rec", ds + "/train/a2.rec"});
  CHECK(frontend::Glob(**m, paths, ds + "/*/a?.rec") ==
        V{ds + "/train/a1.rec", ds + "/train/a2.rec"});
  CHECK(frontend::Glob(**m, paths, ds + "/*/*/a*") == V{ds + "/val/deep/a3.rec"});
  CHECK(frontend::Glob(**m, paths, ds + "/*") == V{ds + "/train", ds + "/val"});
  CHECK(frontend::Glob(**m, paths, ds + "/train/[b]*") == V{ds + "/train/b1.txt"});
  CHECK(frontend::Glob(**m, paths, ds + "/train/a1.rec") == V{ds + "/train/a1.rec"});
  CHECK(frontend::Glob(**m, paths, ds + "/nope/*").empty());
  CHECK(frontend::Glob(**m, paths, dir.path() + "/*").empty());  // Outside the dataset.
}

// Runs `body` in a forked child with `env` set; returns its exit code and
// what it wrote to stderr.
std::pair<int, std::string> InChild(const std::vector<std::pair<std::string, std::string>>& env,
                                    const std::function<int()>& body) {
  int err[2];
  REQUIRE(::pipe(err) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(err[1], 2);
    ::close(err[0]);
    ::unsetenv("MONARCH_CONFIG");
    ::unsetenv("MONARCH_DATASET");
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::exit(body());  // exit(), not _exit(): the at-exit close must run.
  }
  ::close(err[1]);
  std::string text;
  char buffer[512];
  for (ssize_t n; (n = ::read(err[0], buffer, sizeof(buffer))) > 0;) text.append(buffer, n);
  ::close(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), text};
}

TEST_CASE("process instance: not configured, or a missing config, is FailedPrecondition, once") {
  auto [code, err] = InChild({}, [] {
    for (int i = 0; i < 3; ++i) {
      frontend::ProcessInstance::Use use("test_fe");
      if (use.ok() || !absl::IsFailedPrecondition(use.status())) return 1;
      if (!absl::StrContains(use.status().message(), "MONARCH_CONFIG")) return 2;
    }
    return 0;
  });
  CHECK(code == 0);
  CHECK(err == "test_fe: not configured: set MONARCH_CONFIG to a YAML config file or "
               "MONARCH_DATASET to the dataset directory before the first access\n");
  auto [code2, err2] = InChild({{"MONARCH_CONFIG", "/nonexistent/monarch.yaml"}}, [] {
    frontend::ProcessInstance::Use use("test_fe");
    return !use.ok() && absl::IsFailedPrecondition(use.status()) &&
                   absl::StrContains(use.status().message(), "/nonexistent/monarch.yaml")
               ? 0
               : 1;
  });
  CHECK(code2 == 0);
  CHECK(absl::StrContains(err2, "test_fe: cannot start from config '/nonexistent/monarch.yaml'"));
}

TEST_CASE("process instance: opened from MONARCH_DATASET, closed at exit while readers run") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 20, {300000});
  auto [code, err] = InChild({{"MONARCH_DATASET", ds}}, [&] {
    {
      frontend::ProcessInstance::Use use("test_fe");
      if (!use.ok()) return 1;
      std::string name;
      if (!use.paths().ToDatasetName(ds + "/" + files[0].name, &name)) return 2;
      std::vector<char> buffer(files[0].size);
      auto n = use->Read(name, buffer.data(), buffer.size(), 0);
      if (!n.ok() || !testing::BytesMatch(files[0], buffer.data(), 0, *n)) return 3;
    }
    // Readers that never stop: exit must close the instance without a crash,
    // and uses after that get Cancelled rather than a destroyed instance.
    for (int t = 0; t < 4; ++t) {
      std::thread([&files] {
        std::vector<char> buffer(1 << 20);
        for (size_t i = 0;; ++i) {
          frontend::ProcessInstance::Use use("test_fe");
          if (!use.ok()) {
            if (!absl::IsCancelled(use.status())) std::abort();
            continue;
          }
          const testing::TestFile& f = files[i % files.size()];
          auto n = use->Read(f.name, buffer.data(), buffer.size(), 0);
          if (!n.ok() || !testing::BytesMatch(f, buffer.data(), 0, *n)) std::abort();
        }
      }).detach();
    }
    ::usleep(100000);
    return 0;
  });
  CHECK(code == 0);
  CHECK(err.empty());
}

}  // namespace
}  // namespace monarch
