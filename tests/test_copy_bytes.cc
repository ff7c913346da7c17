// CopyBytes and the reads around the CPU's slow copy range
// (common/copy_bytes.h): exact bytes at every distance, with the detours
// forced on (whatever this CPU is) and off; the detour really taken, and
// its own copies outside the slow range; hits from each tier kind into a
// buffer 16 bytes into its page, as malloc() places a large one.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/copy_bytes.h"
#include "common/file_util.h"
#include "common/os.h"
#include "instance_util.h"
#include "test_util.h"

namespace monarch {
namespace {

using testing::ScratchDir;

struct Free {
  void operator()(char* p) const { std::free(p); }
};
using Aligned = std::unique_ptr<char, Free>;
Aligned PageAligned(size_t n) {
  return Aligned(static_cast<char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096)));
}

std::vector<char> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> bytes(n);
  for (char& c : bytes) c = static_cast<char>(rng());
  return bytes;
}

// Restores the probe's decision at the end of a test case.
struct ScopedDetour {
  explicit ScopedDetour(AliasingDetour mode) { SetAliasingDetourForTesting(mode); }
  ~ScopedDetour() { SetAliasingDetourForTesting(AliasingDetour::kProbe); }
};

// Counts preads and checks that none copies within the slow range when the
// detour is forced.
class RecordingEnv final : public os::Env {
 public:
  ssize_t Pread(int fd, void* buffer, size_t n, off_t offset) override {
    ++calls;
    if (n > 2048 && NearAliased(reinterpret_cast<uintptr_t>(buffer), offset)) ++near_aliased;
    return os::Env::Pread(fd, buffer, n, offset);
  }
  int calls = 0;
  int near_aliased = 0;
};

TEST_CASE("NearAliased is the range 1..63 bytes ahead, modulo 4 KiB") {
  CHECK_FALSE(NearAliased(4096, 0));
  CHECK(NearAliased(4096 + 16, 0));
  CHECK(NearAliased(1, 0));
  CHECK(NearAliased(63, 0));
  CHECK_FALSE(NearAliased(64, 0));
  CHECK_FALSE(NearAliased(0, 16));  // Behind: 4080 ahead.
  CHECK(NearAliased(8192 + 4096 + 20, 4096 + 4));
  // The probe ran and found something it can say.
  const AliasingProbe& probe = ProbeAliasing();
  CHECK(probe.copy_ratio > 0);
  CHECK(probe.read_ratio > 0);
  MESSAGE("this CPU: copy ", probe.copy_ratio, "x, read ", probe.read_ratio,
          "x slower in the range; detours ", std::string(probe.copy_slow ? "on" : "off"),
          "/", std::string(probe.read_slow ? "on" : "off"));
}

TEST_CASE("CopyBytes copies exactly at every distance, with and without the detour") {
  const std::vector<char> source = RandomBytes(300000, 1);
  Aligned src = PageAligned(source.size() + 4096);
  Aligned dst = PageAligned(source.size() + 8192);
  for (AliasingDetour mode : {AliasingDetour::kAlways, AliasingDetour::kNever}) {
    ScopedDetour detour(mode);
    for (size_t src_at : {size_t{0}, size_t{5}, size_t{4000}}) {
      std::memcpy(src.get() + src_at, source.data(), source.size());
      for (size_t distance : {0, 1, 16, 31, 32, 63, 64, 2048, 4095}) {
        for (size_t n : {size_t{1}, size_t{2048}, size_t{2049}, size_t{5000}, size_t{110000},
                         size_t{300000}}) {
          char* to = dst.get() + (src_at + distance) % 4096;
          std::memset(to, 0, n + 1);
          CopyBytes(to, src.get() + src_at, n);
          REQUIRE_MESSAGE(std::memcmp(to, source.data(), n) == 0,
                          absl::StrCat("distance ", distance, ", ", n, " bytes"));
          REQUIRE(to[n] == 0);  // Not a byte past the end.
        }
      }
    }
  }
}

TEST_CASE("PreadFull reads exactly at every distance, and the detour goes around the range") {
  ScratchDir dir;
  const std::vector<char> content = RandomBytes(700000, 2);
  const std::string path = dir.path() + "/file.bin";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(std::fwrite(content.data(), 1, content.size(), f) == content.size());
    std::fclose(f);
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  Aligned buffer = PageAligned(content.size() + 8192);
  for (AliasingDetour mode : {AliasingDetour::kAlways, AliasingDetour::kNever}) {
    ScopedDetour detour(mode);
    for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{4113},
                            uint64_t{100000}, uint64_t{699000}}) {
      for (size_t distance : {0, 1, 16, 31, 48, 63, 64, 2048}) {
        const size_t n = 600000;  // More than one bounce buffer's worth.
        char* to = buffer.get() + (offset + distance) % 4096;
        RecordingEnv env;
        absl::StatusOr<size_t> got;
        {
          os::ScopedEnvForTesting scoped(&env);
          got = PreadFull(fd, to, n, offset, path);
        }
        REQUIRE(got.ok());
        const size_t want = std::min<uint64_t>(n, content.size() - offset);
        REQUIRE(*got == want);  // Short only at the end of the file.
        REQUIRE_MESSAGE(std::memcmp(to, content.data() + offset, want) == 0,
                        absl::StrCat("offset ", offset, ", distance ", distance));
        const bool slow = distance != 0 && distance < 64 && want > 2048;
        if (mode == AliasingDetour::kAlways) {
          CHECK(env.near_aliased == 0);
          // 256 KiB at a time through the bounce buffer, and one more call
          // that finds the end of the file.
          if (slow) CHECK(env.calls >= static_cast<int>((want + (256 << 10) - 1) / (256 << 10)));
        } else {
          CHECK(env.calls <= 2);  // One read, and one at the end of the file.
        }
      }
    }
  }
  ::close(fd);
}

// A hit from every kind of tier, read into a buffer 16 bytes into its page
// from offset 0 (the slow case when the detour is off), is exact.
TEST_CASE("hits from ram, posix and pmem tiers into a buffer 16 bytes into its page are exact") {
  ScopedDetour detour(AliasingDetour::kAlways);
  ScratchDir dir;
  const std::string ds = dir.Sub("ds");
  auto files = testing::MakeDataset(ds, 4, {110000, 300000, 5000, 2500000});
  for (TierKind kind : {TierKind::kRam, TierKind::kPosix, TierKind::kPmem}) {
    const std::string tier = dir.Sub(absl::StrCat("tier", static_cast<int>(kind)));
    TierConfig upper = kind == TierKind::kRam ? testing::RamTier(64 << 20)
                                              : testing::FileTier(kind, tier, 64 << 20, "tier");
    auto m = testing::MustCreate(testing::MakeConfig(ds, {upper}));
    Aligned buffer = PageAligned((4 << 20) + 4096);
    char* at16 = buffer.get() + 16;
    for (int pass = 0; pass < 3; ++pass) {  // Miss, then hits.
      for (const testing::TestFile& f : files) {
        for (uint64_t offset : {uint64_t{0}, uint64_t{4096 + 100}}) {
          if (offset >= f.size) continue;
          absl::StatusOr<size_t> n = m->Read(f.name, at16, 4 << 20, offset);
          REQUIRE_MESSAGE(n.ok(), n.status().ToString());
          REQUIRE(*n == f.size - offset);
          REQUIRE_MESSAGE(testing::BytesMatch(f, at16, offset, *n),
                          absl::StrCat(f.name, " at ", offset, ", pass ", pass));
        }
      }
      m->WaitForPlacement();
    }
    CHECK(m->GetStats().Tier(0, "files") == files.size());
  }
}

}  // namespace
}  // namespace monarch
