// Helpers for tests that run a whole Monarch instance: create one with
// fault-injecting drivers in chosen places, and read a file through it
// checking every byte.

#ifndef MONARCH_TESTS_INSTANCE_UTIL_H_
#define MONARCH_TESTS_INSTANCE_UTIL_H_

#include <doctest/doctest.h>

#include <signal.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/os.h"
#include "drivers/copy_integrity.h"
#include "monarch/monarch.h"
#include "core/monarch_internal.h"
#include "test_util.h"

namespace monarch::testing {

// A read-only private mapping of bytes [offset, offset + length) of the file
// at `path`, as a front end maps a big dataset file before
// Monarch::MapCopies; unmapped when it goes.
class SourceMapping {
 public:
  SourceMapping(const std::string& path, uint64_t length, uint64_t offset = 0)
      : length_(length), offset_(offset) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    void* mapped = ::mmap(nullptr, length, PROT_READ, MAP_PRIVATE, fd, static_cast<off_t>(offset));
    ::close(fd);
    REQUIRE(mapped != MAP_FAILED);
    data_ = static_cast<char*>(mapped);
  }
  ~SourceMapping() { ::munmap(data_, length_); }
  SourceMapping(const SourceMapping&) = delete;
  SourceMapping& operator=(const SourceMapping&) = delete;

  char* data() const { return data_; }
  // MapCopies of `name` over all of it: the bytes mapped from copies.
  uint64_t MapCopies(Monarch& m, const std::string& name) const {
    absl::StatusOr<uint64_t> mapped =
        m.MapCopies(name, data_, offset_, length_, PROT_READ, MAP_PRIVATE);
    REQUIRE_MESSAGE(mapped.ok(), mapped.status().ToString());
    return *mapped;
  }

 private:
  char* data_ = nullptr;
  const uint64_t length_;
  const uint64_t offset_;
};

// An instance whose source driver is wrapped by `wrap_source` (the
// source is the last tier).
inline std::unique_ptr<Monarch> MustCreateWrappingSource(
    const Config& config,
    std::function<std::unique_ptr<StorageDriver>(std::unique_ptr<StorageDriver>)> wrap_source) {
  const int source_index = static_cast<int>(config.tiers.size()) - 1;
  DriverWrapper wrap = [=](int index,
                           std::unique_ptr<StorageDriver> d) -> std::unique_ptr<StorageDriver> {
    return index == source_index ? wrap_source(std::move(d)) : std::move(d);
  };
  absl::StatusOr<std::unique_ptr<Monarch>> m = CreateMonarchWithDriverWrapper(config, wrap);
  REQUIRE_MESSAGE(m.ok(), m.status().ToString());
  return std::move(*m);
}

// An instance whose source is wrapped in `source` faults and whose tier
// `tier` in `tier_faults` (either may be null: no wrapping).
inline absl::StatusOr<std::unique_ptr<Monarch>> CreateWithFaults(
    const Config& config, FaultInjectingDriver::Faults* source = nullptr, int tier = -1,
    FaultInjectingDriver::Faults* tier_faults = nullptr) {
  const int source_index = static_cast<int>(config.tiers.size()) - 1;
  DriverWrapper wrap = [=](int index,
                           std::unique_ptr<StorageDriver> d) -> std::unique_ptr<StorageDriver> {
    if (index == source_index && source != nullptr)
      return std::make_unique<FaultInjectingDriver>(std::move(d), source);
    if (index == tier && tier_faults != nullptr)
      return std::make_unique<FaultInjectingDriver>(std::move(d), tier_faults);
    return d;
  };
  return CreateMonarchWithDriverWrapper(config, wrap);
}

// CreateWithFaults, failing the test case when the instance cannot be made.
inline std::unique_ptr<Monarch> MustCreate(const Config& config,
                                           FaultInjectingDriver::Faults* source = nullptr,
                                           int tier = -1,
                                           FaultInjectingDriver::Faults* tier_faults = nullptr) {
  absl::StatusOr<std::unique_ptr<Monarch>> m = CreateWithFaults(config, source, tier, tier_faults);
  REQUIRE_MESSAGE(m.ok(), m.status().ToString());
  return std::move(*m);
}

// Kills `child` with SIGKILL 20 to 170 ms from now (drawn from `rng`), in
// the middle of whatever it does, and reaps it.
inline void KillSoon(pid_t child, std::mt19937& rng) {
  std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 150));
  ::kill(child, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
}

// Bytes a file tier's copy of a `size`-byte file takes: the bytes, then
// their checksums.
inline uint64_t OnDisk(uint64_t size) { return size + CopyTrailerBytes(size); }

// Reads the whole file in `chunk`-sized calls and checks every byte.
inline void ReadWholeAndCheck(Monarch& m, const TestFile& f, size_t chunk = 1 << 20) {
  std::vector<char> buffer(chunk);
  uint64_t offset = 0;
  while (offset < f.size) {
    absl::StatusOr<size_t> n = m.Read(f.name, buffer.data(), chunk, offset);
    REQUIRE_MESSAGE(n.ok(), absl::StrCat(f.name, ": ", n.status().ToString()));
    REQUIRE(*n == std::min<uint64_t>(chunk, f.size - offset));
    REQUIRE_MESSAGE(BytesMatch(f, buffer.data(), offset, *n), absl::StrCat(f.name, " at ", offset));
    offset += *n;
  }
}

// Copies read slowly (a device; here a delay on reads under the tier's
// directory), or a source whose bytes left memory (RWF_NOWAIT refused).
class CopySpeedEnv final : public os::Env {
 public:
  explicit CopySpeedEnv(std::string tier_dir) : tier_dir_(std::move(tier_dir)) {}
  ssize_t Pread(int fd, void* buffer, size_t n, off_t offset) override {
    if (slow_copies_.load() && PathOf(fd).rfind(tier_dir_, 0) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return os::Env::Pread(fd, buffer, n, offset);
  }
  ssize_t PreadNoWait(int fd, void* buffer, size_t n, off_t offset) override {
    if (source_evicted_.load()) {
      errno = EAGAIN;
      return -1;
    }
    return os::Env::PreadNoWait(fd, buffer, n, offset);
  }
  int Mincore(void* address, size_t length, unsigned char* vector) override {
    if (source_evicted_.load()) {  // Only the source's files are asked.
      std::memset(vector, 0, (length + 4095) / 4096);
      return 0;
    }
    return os::Env::Mincore(address, length, vector);
  }
  int Cachestat(int fd, uint64_t offset, uint64_t length, uint64_t* cached_pages) override {
    if (source_evicted_.load()) {
      *cached_pages = 0;
      return 0;
    }
    return os::Env::Cachestat(fd, offset, length, cached_pages);
  }
  void SlowCopies(bool slow) { slow_copies_.store(slow); }
  void EvictSource(bool evicted) { source_evicted_.store(evicted); }

 private:
  static std::string PathOf(int fd) {
    char link[64], path[4096];
    std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    const ssize_t got = ::readlink(link, path, sizeof(path) - 1);
    return got > 0 ? std::string(path, static_cast<size_t>(got)) : std::string();
  }
  const std::string tier_dir_;
  std::atomic<bool> slow_copies_{false};
  std::atomic<bool> source_evicted_{false};
};

}  // namespace monarch::testing

#endif  // MONARCH_TESTS_INSTANCE_UTIL_H_
