// Status plumbing shared by every Monarch source file.
//
// Debian's Abseil (20220623) has no RETURN_IF_ERROR / ASSIGN_OR_RETURN, so
// they are defined once here. ErrnoToStatus() is the single place where an
// errno becomes a canonical status code.

#ifndef MONARCH_COMMON_STATUS_MACROS_H_
#define MONARCH_COMMON_STATUS_MACROS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#define MONARCH_CONCAT_INNER_(a, b) a##b
#define MONARCH_CONCAT_(a, b) MONARCH_CONCAT_INNER_(a, b)

#define MONARCH_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status monarch_status_ = (expr);           \
    if (!monarch_status_.ok()) return monarch_status_; \
  } while (0)

#define MONARCH_ASSIGN_OR_RETURN(lhs, expr) \
  MONARCH_ASSIGN_OR_RETURN_IMPL_(MONARCH_CONCAT_(monarch_statusor_, __LINE__), lhs, expr)

#define MONARCH_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

namespace monarch {

// Maps an errno value to the closest canonical code: ENOENT -> NotFound,
// ENOSPC/EDQUOT/EMFILE -> ResourceExhausted, EACCES -> PermissionDenied,
// EROFS/EPERM -> PermissionDenied, EIO and the rest -> Internal/Unknown.
// The message is "<context>: <strerror>".
absl::Status ErrnoToStatus(int error_number, absl::string_view context);

// The other way, for front ends that must answer with an errno (the preload
// library): the errno a plain system call would most likely have given for
// an error of this kind. Failed I/O (DataLoss, Internal, Unknown) is EIO.
int StatusToErrno(const absl::Status& status);

// `value` in single quotes for an error message, cut to its first 200
// characters (and its size given) so that a huge value cannot make a huge
// message.
std::string QuoteForError(absl::string_view value);

}  // namespace monarch

#endif  // MONARCH_COMMON_STATUS_MACROS_H_
