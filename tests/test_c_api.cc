// The C API: same behaviour as the C++ API, codes and messages for errors.

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "monarch/monarch_c.h"
#include "test_util.h"

namespace {

using monarch::testing::ScratchDir;

// The number after "key": in a flat JSON object; -1 if the key is absent.
long long JsonNumber(const char* json, const std::string& key) {
  const std::string quoted = "\"" + key + "\":";
  const char* at = std::strstr(json, quoted.c_str());
  return at == nullptr ? -1 : std::strtoll(at + quoted.size(), nullptr, 10);
}

TEST_CASE("C API: open, read, list, stat, stats, close") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = monarch::testing::MakeDataset(ds, 4, {5000});
  monarch_t* m = nullptr;
  char* error = nullptr;
  REQUIRE(monarch_open_default(ds.c_str(), &m, &error) == MONARCH_OK);
  CHECK(error == nullptr);
  REQUIRE(m != nullptr);
  CHECK(monarch_usable_after_fork(m) == 0);  // In process: its threads stay in the parent.
  CHECK(monarch_usable_after_fork(nullptr) == 0);

  char buffer[6000];
  size_t n = 0;
  CHECK(monarch_read(m, files[1].name.c_str(), buffer, sizeof(buffer), 0, &n, &error) ==
        MONARCH_OK);
  CHECK(n == 5000);
  CHECK(monarch::testing::BytesMatch(files[1], buffer, 0, n));
  CHECK(monarch_read(m, files[1].name.c_str(), buffer, 10, 5000, &n, nullptr) == MONARCH_OK);
  CHECK(n == 0);

  CHECK(monarch_read(m, "dir0/missing", buffer, 10, 0, &n, &error) == MONARCH_NOT_FOUND);
  REQUIRE(error != nullptr);
  CHECK(std::strstr(error, "dir0/missing") != nullptr);
  monarch_free(error);

  uint64_t size = 0;
  CHECK(monarch_file_size(m, files[0].name.c_str(), &size, nullptr) == MONARCH_OK);
  CHECK(size == 5000);
  int64_t mtime_ns = 0;
  CHECK(monarch_stat(m, files[0].name.c_str(), &size, &mtime_ns, nullptr) == MONARCH_OK);
  CHECK(size == 5000);
  struct stat st;
  REQUIRE(::stat((ds + "/" + files[0].name).c_str(), &st) == 0);
  CHECK(mtime_ns == int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec);
  CHECK(monarch_stat(m, "nope", &size, &mtime_ns, nullptr) == MONARCH_NOT_FOUND);
  CHECK(monarch_file_exists(m, files[0].name.c_str()) == 1);
  CHECK(monarch_file_exists(m, "nope") == 0);
  CHECK(monarch_is_directory(m, "dir0") == 1);
  CHECK(std::string(monarch_dataset_root(m)) == ds);

  char** names = nullptr;
  size_t count = 0;
  REQUIRE(monarch_list_directory(m, "", &names, &count, nullptr) == MONARCH_OK);
  REQUIRE(count == 4);
  CHECK(std::string(names[0]) == "dir0");
  CHECK(std::string(names[3]) == "dir3");
  monarch_free_list(names, count);
  CHECK(monarch_list_directory(m, "nope", &names, &count, nullptr) == MONARCH_NOT_FOUND);

  monarch_wait_for_placement(m);
  char* json = monarch_stats_json(m);
  CHECK(std::strstr(json, "\"promotions_completed\":1") != nullptr);
  monarch_free(json);
  char* text = monarch_stats_prometheus(m);
  CHECK(std::strstr(text, "\nmonarch_promotions_completed_total 1\n") != nullptr);
  monarch_free(text);
  monarch_close(m);
}

TEST_CASE("C API: path mapping and glob for front ends") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = monarch::testing::MakeDataset(ds, 4, {100});
  monarch_t* m = nullptr;
  REQUIRE(monarch_open_default(ds.c_str(), &m, nullptr) == MONARCH_OK);
  char* name = nullptr;
  REQUIRE(monarch_path_to_name(m, (ds + "/" + files[2].name).c_str(), &name) == 1);
  CHECK(std::string(name) == files[2].name);
  monarch_free(name);
  CHECK(monarch_path_to_name(m, (ds + "x/" + files[2].name).c_str(), &name) == 0);
  CHECK(name == nullptr);
  char** paths = nullptr;
  size_t count = 0;
  REQUIRE(monarch_glob(m, (ds + "/dir[12]/*").c_str(), &paths, &count, nullptr) == MONARCH_OK);
  REQUIRE(count == 2);
  CHECK(std::string(paths[0]) == ds + "/" + files[1].name);
  CHECK(std::string(paths[1]) == ds + "/" + files[2].name);
  monarch_free_list(paths, count);
  monarch_close(m);
}

TEST_CASE("C API: the process instance is shared, released, and closed at exit") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = monarch::testing::MakeDataset(ds, 3, {7000});
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::unsetenv("MONARCH_CONFIG");
    ::setenv("MONARCH_DATASET", ds.c_str(), 1);
    monarch_t* a = nullptr;
    monarch_t* b = nullptr;
    if (monarch_process_acquire("test_c", &a, nullptr) != MONARCH_OK) std::_Exit(1);
    if (monarch_process_acquire("test_c", &b, nullptr) != MONARCH_OK || a != b) std::_Exit(2);
    monarch_close(a);  // Ignored for the process instance: it must still work.
    char buffer[8000];
    size_t n = 0;
    if (monarch_read(b, files[0].name.c_str(), buffer, sizeof(buffer), 0, &n, nullptr) !=
            MONARCH_OK ||
        n != 7000 || !monarch::testing::BytesMatch(files[0], buffer, 0, n)) {
      std::_Exit(3);
    }
    monarch_process_release(a);
    monarch_process_release(b);
    std::exit(0);  // The at-exit close runs with no use left.
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::unsetenv("MONARCH_CONFIG");
    ::unsetenv("MONARCH_DATASET");
    ::close(2);  // The one-line complaint is tested in test_frontend.
    monarch_t* m = reinterpret_cast<monarch_t*>(1);
    char* error = nullptr;
    if (monarch_process_acquire("test_c", &m, &error) != MONARCH_FAILED_PRECONDITION) std::_Exit(1);
    if (m != nullptr || error == nullptr || std::strstr(error, "MONARCH_DATASET") == nullptr) {
      std::_Exit(2);
    }
    monarch_free(error);
    monarch_process_release(m);  // NULL: a no-op.
    std::_Exit(0);
  }
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("C API: a bad config gives INVALID_ARGUMENT and a message naming the key") {
  monarch_t* m = reinterpret_cast<monarch_t*>(1);
  char* error = nullptr;
  CHECK(monarch_open_yaml_string("tiers: 3\n", &m, &error) == MONARCH_INVALID_ARGUMENT);
  CHECK(m == nullptr);
  REQUIRE(error != nullptr);
  CHECK(std::strstr(error, "dataset") != nullptr);
  monarch_free(error);
  CHECK(monarch_open_yaml_file("/nonexistent.yaml", &m, &error) == MONARCH_NOT_FOUND);
  monarch_free(error);
}

TEST_CASE("C API: sharing the node by default keeps a config's explicit node.shared: false") {
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  monarch::testing::MakeDataset(ds, 2, {100});
  monarch_t* m = nullptr;
  char* error = nullptr;
  const std::string yaml = "dataset: {path: " + ds +
                           "}\ntiers: [{kind: ram, capacity: 1MiB}, {kind: source}]\n"
                           "node: {shared: false}\n";
  REQUIRE(monarch_open_sharing_node(nullptr, yaml.c_str(), nullptr, &m, &error) == MONARCH_OK);
  CHECK(monarch_usable_after_fork(m) == 0);  // In process, as the config says.
  monarch_close(m);
  // Exactly one source of the config.
  CHECK(monarch_open_sharing_node(nullptr, nullptr, nullptr, &m, &error) ==
        MONARCH_INVALID_ARGUMENT);
  CHECK(m == nullptr);
  REQUIRE(error != nullptr);
  CHECK(std::strstr(error, "exactly one") != nullptr);
  monarch_free(error);
  CHECK(monarch_open_sharing_node("/x.yaml", yaml.c_str(), nullptr, &m, &error) ==
        MONARCH_INVALID_ARGUMENT);
  monarch_free(error);
  // A config it cannot read is the same error as monarch_open_yaml_file's.
  CHECK(monarch_open_sharing_node("/nonexistent.yaml", nullptr, nullptr, &m, &error) ==
        MONARCH_NOT_FOUND);
  monarch_free(error);
}

TEST_CASE("C API: announcing a read order prefetches it") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = monarch::testing::MakeDataset(ds, 6, {3000});
  monarch_t* m = nullptr;
  REQUIRE(monarch_open_default(ds.c_str(), &m, nullptr) == MONARCH_OK);
  char* error = nullptr;
  const char* unknown[] = {files[0].name.c_str(), "dir0/missing"};
  CHECK(monarch_announce_order(m, unknown, 2, &error) == MONARCH_NOT_FOUND);
  REQUIRE(error != nullptr);
  CHECK(std::strstr(error, "dir0/missing") != nullptr);
  monarch_free(error);
  error = nullptr;
  const char* with_null[] = {files[0].name.c_str(), nullptr};
  CHECK(monarch_announce_order(m, with_null, 2, &error) == MONARCH_INVALID_ARGUMENT);
  REQUIRE(error != nullptr);
  CHECK(std::strstr(error, "names[1]") != nullptr);
  monarch_free(error);
  CHECK(monarch_announce_order(m, nullptr, 1, nullptr) == MONARCH_INVALID_ARGUMENT);
  CHECK(monarch_announce_order(nullptr, nullptr, 0, nullptr) == MONARCH_INVALID_ARGUMENT);

  std::vector<const char*> order;
  for (const auto& f : files) order.push_back(f.name.c_str());
  REQUIRE(monarch_announce_order(m, order.data(), order.size(), nullptr) == MONARCH_OK);
  // The streams promote the files without a read: the RAM tier fills.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    char* json = monarch_stats_json(m);
    REQUIRE(json != nullptr);
    const bool all = std::strstr(json, "\"prefetch_files\":6,") != nullptr;
    monarch_free(json);
    if (all) break;
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK(monarch_announce_order(m, nullptr, 0, nullptr) == MONARCH_OK);  // Withdrawn.
  monarch_close(m);
}

TEST_CASE("C API: a sampled order's epochs, with a size query, and its announcement") {
  monarch_sampled_order how{};
  how.seed = 42;
  how.epochs = 1;
  how.shuffle = 1;
  how.rank = 1;
  how.world_size = 3;
  size_t count = 99;
  char* error = nullptr;
  // The size query: capacity 0, no buffer.
  REQUIRE(monarch_sampled_epoch(&how, 10, 0, nullptr, 0, &count, &error) == MONARCH_OK);
  CHECK(error == nullptr);
  CHECK(count == 4);
  std::vector<uint64_t> indices(count);
  REQUIRE(monarch_sampled_epoch(&how, 10, 0, indices.data(), indices.size(), &count, nullptr) ==
          MONARCH_OK);
  // The golden value test_sampled_order.cc pins for the C++ function.
  CHECK(indices == std::vector<uint64_t>{3, 9, 1, 0});
  how.drop_last = 1;
  REQUIRE(monarch_sampled_epoch(&how, 10, 0, indices.data(), indices.size(), &count, nullptr) ==
          MONARCH_OK);
  CHECK(count == 3);
  CHECK(std::vector<uint64_t>(indices.begin(), indices.begin() + 3) ==
        std::vector<uint64_t>{3, 9, 1});
  how.drop_last = 0;
  // Too small a buffer: the count needed, nothing written.
  uint64_t small[2] = {77, 77};
  CHECK(monarch_sampled_epoch(&how, 10, 0, small, 2, &count, &error) == MONARCH_INVALID_ARGUMENT);
  CHECK(count == 4);
  CHECK(small[0] == 77);
  REQUIRE(error != nullptr);
  CHECK(std::strstr(error, "capacity") != nullptr);
  monarch_free(error);
  error = nullptr;
  how.rank = 3;
  CHECK(monarch_sampled_epoch(&how, 10, 0, nullptr, 0, &count, &error) ==
        MONARCH_INVALID_ARGUMENT);
  REQUIRE(error != nullptr);
  CHECK(std::strstr(error, "rank") != nullptr);
  monarch_free(error);
  error = nullptr;
  how.rank = 0;
  how.world_size = 1;

  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = monarch::testing::MakeDataset(ds, 8, {3000});
  monarch_t* m = nullptr;
  REQUIRE(monarch_open_default(ds.c_str(), &m, nullptr) == MONARCH_OK);
  std::vector<const char*> names;
  for (const auto& f : files) names.push_back(f.name.c_str());
  how.epochs = 101;
  CHECK(monarch_announce_sampled_order(m, names.data(), names.size(), &how, &error) ==
        MONARCH_INVALID_ARGUMENT);
  REQUIRE(error != nullptr);
  CHECK(std::strstr(error, "epochs") != nullptr);
  monarch_free(error);
  error = nullptr;
  how.epochs = 3;
  const char* unknown[] = {names[0], "dir0/missing"};
  CHECK(monarch_announce_sampled_order(m, unknown, 2, &how, &error) == MONARCH_NOT_FOUND);
  REQUIRE(error != nullptr);
  CHECK(std::strstr(error, "dir0/missing") != nullptr);
  monarch_free(error);
  error = nullptr;
  REQUIRE(monarch_announce_sampled_order(m, names.data(), names.size(), &how, &error) ==
          MONARCH_OK);
  CHECK(error == nullptr);
  // Three epochs of the 8 files announced; the streams promote all 8 once.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    char* json = monarch_stats_json(m);
    REQUIRE(json != nullptr);
    const bool done = JsonNumber(json, "prefetch_files") == 8;
    if (done) {
      CHECK(JsonNumber(json, "prefetch_announced_files") == 24);
      CHECK(JsonNumber(json, "prefetch_order_files") == 24);
    }
    monarch_free(json);
    if (done) break;
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  monarch_close(m);
}

TEST_CASE("C API: NULL arguments are INVALID_ARGUMENT with a message, never a crash") {
  ScratchDir dir;
  std::string ds = dir.Sub("ds");
  auto files = monarch::testing::MakeDataset(ds, 2, {100});
  monarch_t* m = nullptr;
  char* error = nullptr;
  auto expect_invalid = [&](monarch_code code, const char* argument) {
    CHECK(code == MONARCH_INVALID_ARGUMENT);
    REQUIRE(error != nullptr);
    CHECK(std::strstr(error, argument) != nullptr);
    monarch_free(error);
    error = nullptr;
  };
  expect_invalid(monarch_open_default(ds.c_str(), nullptr, &error), "out");
  expect_invalid(monarch_open_default(nullptr, &m, &error), "dataset_dir");
  CHECK(m == nullptr);
  expect_invalid(monarch_open_yaml_file(nullptr, &m, &error), "path");
  expect_invalid(monarch_open_yaml_string("x: 1", nullptr, &error), "out");
  CHECK(monarch_open_default(nullptr, nullptr, nullptr) == MONARCH_INVALID_ARGUMENT);
  REQUIRE(monarch_open_default(ds.c_str(), &m, nullptr) == MONARCH_OK);

  char buffer[200];
  size_t n = 7;
  const char* name = files[0].name.c_str();
  expect_invalid(monarch_read(m, name, buffer, sizeof(buffer), 0, nullptr, &error), "bytes_read");
  expect_invalid(monarch_read(nullptr, name, buffer, sizeof(buffer), 0, &n, &error), "m");
  CHECK(n == 0);
  expect_invalid(monarch_read(m, nullptr, buffer, sizeof(buffer), 0, &n, &error), "name");
  expect_invalid(monarch_read(m, name, nullptr, sizeof(buffer), 0, &n, &error), "buffer");
  CHECK(monarch_read(m, name, nullptr, 0, 0, &n, nullptr) == MONARCH_OK);  // n == 0: no buffer.
  uint64_t copies_mapped = 7;
  expect_invalid(monarch_map_copies(m, name, buffer, 0, 4096, 1, 2, nullptr, &error),
                 "mapped_bytes");
  expect_invalid(monarch_map_copies(m, name, nullptr, 0, 4096, 1, 2, &copies_mapped, &error),
                 "mapping");
  CHECK(copies_mapped == 0);
  expect_invalid(monarch_map_copies(m, nullptr, buffer, 0, 4096, 1, 2, &copies_mapped, &error),
                 "name");
  // A name outside the dataset: NOT_FOUND, nothing mapped.
  CHECK(monarch_map_copies(m, "missing", buffer, 0, 4096, 1, 2, &copies_mapped, nullptr) ==
        MONARCH_NOT_FOUND);
  uint64_t size = 0;
  int64_t mtime = 0;
  expect_invalid(monarch_file_size(m, name, nullptr, &error), "size");
  expect_invalid(monarch_file_size(nullptr, name, &size, &error), "m");
  expect_invalid(monarch_stat(m, name, &size, nullptr, &error), "mtime_ns");
  expect_invalid(monarch_stat(m, nullptr, &size, &mtime, &error), "name");
  char** names = nullptr;
  size_t count = 0;
  expect_invalid(monarch_list_directory(m, "", nullptr, &count, &error), "names");
  expect_invalid(monarch_list_directory(m, "", &names, nullptr, &error), "count");
  expect_invalid(monarch_list_directory(m, nullptr, &names, &count, &error), "dir");
  expect_invalid(monarch_glob(m, nullptr, &names, &count, &error), "pattern");
  expect_invalid(monarch_process_acquire("x", nullptr, &error), "out");
  CHECK(monarch_file_exists(nullptr, name) == 0);
  CHECK(monarch_is_directory(m, nullptr) == 0);
  CHECK(monarch_dataset_root(nullptr) == nullptr);
  CHECK(monarch_stats_json(nullptr) == nullptr);
  CHECK(monarch_stats_prometheus(nullptr) == nullptr);
  char* mapped = nullptr;
  CHECK(monarch_path_to_name(m, nullptr, &mapped) == 0);
  CHECK(monarch_path_to_name(nullptr, ds.c_str(), &mapped) == 0);
  CHECK(monarch_path_to_name(m, ds.c_str(), nullptr) == 0);
  monarch_sampled_order how{};
  how.epochs = 1;
  how.world_size = 1;
  size_t indices_count = 0;
  uint64_t indices[4];
  expect_invalid(monarch_sampled_epoch(&how, 4, 0, indices, 4, nullptr, &error), "count");
  expect_invalid(monarch_sampled_epoch(nullptr, 4, 0, indices, 4, &indices_count, &error), "how");
  expect_invalid(monarch_sampled_epoch(&how, 4, 0, nullptr, 4, &indices_count, &error), "indices");
  const char* files_list[] = {name, nullptr};
  expect_invalid(monarch_announce_sampled_order(nullptr, files_list, 1, &how, &error), "m");
  expect_invalid(monarch_announce_sampled_order(m, files_list, 1, nullptr, &error), "how");
  expect_invalid(monarch_announce_sampled_order(m, nullptr, 1, &how, &error), "files");
  expect_invalid(monarch_announce_sampled_order(m, files_list, 2, &how, &error), "files[1]");
  expect_invalid(monarch_announce_sampled_order(m, nullptr, 0, &how, &error), "files");
  CHECK(monarch_announce_sampled_order(nullptr, nullptr, 0, nullptr, nullptr) ==
        MONARCH_INVALID_ARGUMENT);
  monarch_wait_for_placement(nullptr);
  monarch_free_list(nullptr, 3);
  monarch_process_release(nullptr);
  monarch_close(nullptr);
  // Still works after all that.
  CHECK(monarch_read(m, name, buffer, sizeof(buffer), 0, &n, nullptr) == MONARCH_OK);
  CHECK(n == 100);
  monarch_close(m);
}

}  // namespace
