// Minimal leveled logging to stderr.

#include "common/log.h"

#include <atomic>
#include <cstdio>

namespace monarch {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
constexpr const char* kLevelNames[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

void LogMessage(LogLevel level, absl::string_view message) {
  std::fprintf(stderr, "monarch %s: %.*s\n", kLevelNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace monarch
