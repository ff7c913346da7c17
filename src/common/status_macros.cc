// errno -> absl::Status, in one place.

#include "common/status_macros.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace monarch {

std::string QuoteForError(absl::string_view value) {
  constexpr size_t kMaxQuotedChars = 200;
  if (value.size() <= kMaxQuotedChars) return absl::StrCat("'", value, "'");
  return absl::StrCat("'", value.substr(0, kMaxQuotedChars), "...' (", value.size(), " bytes)");
}

absl::Status ErrnoToStatus(int error_number, absl::string_view context) {
  const std::string message = absl::StrCat(context, ": ", std::strerror(error_number));
  switch (error_number) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    case EINVAL:
    case ENAMETOOLONG:
    case EISDIR:
      return absl::InvalidArgumentError(message);
    case EAGAIN:
    case EBUSY:
    case ETIMEDOUT:
      return absl::UnavailableError(message);
    case EIO:
      return absl::DataLossError(message);
    default:
      return absl::InternalError(message);
  }
}

int StatusToErrno(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kNotFound:
      return ENOENT;
    case absl::StatusCode::kAlreadyExists:
      return EEXIST;
    case absl::StatusCode::kPermissionDenied:
      return EACCES;
    case absl::StatusCode::kResourceExhausted:
      return ENOMEM;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return EINVAL;
    case absl::StatusCode::kUnavailable:
      return EAGAIN;
    case absl::StatusCode::kDeadlineExceeded:
      return ETIMEDOUT;
    case absl::StatusCode::kCancelled:
      return ECANCELED;
    case absl::StatusCode::kUnimplemented:
      return ENOSYS;
    default:  // DataLoss, Internal, Unknown, FailedPrecondition, Aborted.
      return EIO;
  }
}

}  // namespace monarch
