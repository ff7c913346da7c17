// The preload library's descriptor table under concurrent opens, dups,
// closes and lookups (run under TSan by scripts/test.sh): a lookup finds
// either nothing or the file registered at that number, never another's,
// and the count of registered descriptors comes back to zero.

#include <doctest/doctest.h>

#include <cerrno>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../integrations/preload/descriptor_table.h"
#include "common/status_macros.h"

namespace monarch::preload {
namespace {

std::shared_ptr<OpenFile> FileFor(int fd) {
  auto file = std::make_shared<OpenFile>();
  file->name = "file-" + std::to_string(fd);
  return file;
}

TEST_CASE("preload table: lookups see registered files or nothing, never another's") {
  static DescriptorTable table;  // As in the library: no constructor needed.
  CHECK(table.Empty());
  CHECK(table.Find(5) == nullptr);
  CHECK(table.Find(-1) == nullptr);
  CHECK(table.Find(DescriptorTable::kPages * DescriptorTable::kPageSize) == nullptr);
  CHECK_FALSE(table.Set(DescriptorTable::kPages * DescriptorTable::kPageSize, FileFor(0)));

  constexpr int kThreads = 4;
  constexpr int kRounds = 20000;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &wrong] {
      for (int i = 0; i < kRounds; ++i) {
        // Writers own disjoint numbers (spread over two pages); every thread
        // reads every number.
        const int mine = t * 700 + (i % 500);
        if (i % 3 == 0) {
          table.Set(mine, FileFor(mine));
        } else if (i % 3 == 1) {
          table.Forget(mine);
        }
        const int other = ((t + 1) % kThreads) * 700 + (i * 7 % 500);
        if (std::shared_ptr<OpenFile> file = table.Find(other)) {
          if (file->name != "file-" + std::to_string(other)) wrong.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(wrong.load() == 0);

  int registered = 0;
  table.ForEach(0, ~0u, [&registered](int fd, const std::shared_ptr<OpenFile>& file) {
    CHECK(file->name == "file-" + std::to_string(fd));
    ++registered;
  });
  CHECK(registered > 0);
  table.ForEach(0, ~0u, [](int fd, const std::shared_ptr<OpenFile>&) { table.Forget(fd); });
  CHECK(table.Empty());
}

TEST_CASE("preload table: a dup shares the open file, a reused number replaces a stale entry") {
  static DescriptorTable table;
  std::shared_ptr<OpenFile> file = FileFor(3);
  REQUIRE(table.Set(3, file));
  REQUIRE(table.Set(9, file));  // dup(3) == 9.
  std::shared_ptr<OpenFile> copy = table.Find(9);
  REQUIRE(copy != nullptr);
  copy->offset.store(42);
  std::shared_ptr<OpenFile> original = table.Find(3);
  REQUIRE(original != nullptr);
  CHECK(original->offset.load() == 42);  // One offset, as the kernel's.
  copy.reset();
  original.reset();
  table.Forget(3);
  CHECK(table.Find(3) == nullptr);
  CHECK(table.Find(9) == file);
  REQUIRE(table.Set(9, FileFor(9)));  // Number 9 reused for another file.
  CHECK(table.Find(9)->name == "file-9");
  CHECK(file.use_count() == 1);  // The old entry let go of it.
  table.Forget(9);
  CHECK(table.Empty());
}

TEST_CASE("preload: a failed read answers with the errno the plain call would give") {
  // A source error crosses the service as a status (test_service checks the
  // code survives); the hooks turn it back into this errno.
  for (int error : {EIO, EACCES, ENOENT, EINVAL}) {
    CHECK(StatusToErrno(ErrnoToStatus(error, "pread /pfs/a")) == error);
  }
  CHECK(StatusToErrno(absl::InternalError("?")) == EIO);
  CHECK(StatusToErrno(absl::OkStatus()) == 0);
}

}  // namespace
}  // namespace monarch::preload
