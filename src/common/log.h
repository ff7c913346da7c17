// Minimal leveled logging to stderr.
//
// The level is process-wide (set from the config's logging.level); the last
// instance created wins, which is what a single-job process wants.
// Thread-safe: each message is written with one fprintf call.

#ifndef MONARCH_COMMON_LOG_H_
#define MONARCH_COMMON_LOG_H_

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "monarch/config.h"  // LogLevel: logging.level's values.

namespace monarch {

void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void LogMessage(LogLevel level, absl::string_view message);

}  // namespace monarch

#define MONARCH_LOG(level, ...)                                                     \
  do {                                                                              \
    if (::monarch::LogEnabled(::monarch::LogLevel::level))                          \
      ::monarch::LogMessage(::monarch::LogLevel::level, absl::StrCat(__VA_ARGS__)); \
  } while (0)

#endif  // MONARCH_COMMON_LOG_H_
