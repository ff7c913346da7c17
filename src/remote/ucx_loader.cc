// LoadUcx: opens the system's UCX once and resolves the peer layer's
// functions. See ucx_loader.h.

#include "remote/ucx_loader.h"

#include <dlfcn.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace monarch {
namespace {

// The library opened: its soname, which every UCX 1.x installs (Debian's
// libucx0, the packages of other distributions, a cluster's module). It
// pulls in libucs, libuct and libucm through its own dependencies.
constexpr char kLibrary[] = "libucp.so.0";

// What a user without UCX reads: the key that asked for it, what is
// missing, and the ways out.
absl::Status UcxMissing(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(
      "remote.enabled: peers need UCX, but ", what,
      ". Install the system's UCX with its transports (Debian/Ubuntu: apt-get install libucx0; "
      "on a cluster, its UCX module), or add the directory holding ",
      kLibrary, " to LD_LIBRARY_PATH; a single-node job needs no `remote:` in its config"));
}

absl::StatusOr<const UcxApi*> Load() {
  // RTLD_LOCAL: UCX's symbols stay out of the global scope, where they could
  // interpose on another library's. RTLD_NOW: a UCX with an unresolvable
  // symbol of its own fails here, not at its first call.
  void* library = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = ::dlerror();
    return UcxMissing(
        absl::StrCat("it cannot be loaded (", error != nullptr ? error : kLibrary, ")"));
  }
  // A UCX older than the headers Monarch was built with may lack one.
  auto missing_symbol = [](const char* name) {
    return UcxMissing(absl::StrCat("the ", kLibrary, " found has no ", name,
                                   " (Monarch was built with UCX ", UCP_API_MAJOR, ".",
                                   UCP_API_MINOR, ")"));
  };
  auto api = std::make_unique<UcxApi>();
  // dlsym searches the library and its dependencies, so ucs_status_string
  // (libucs) is found through libucp too.
#define MONARCH_UCX_RESOLVE(name)                                               \
  api->name = reinterpret_cast<decltype(api->name)>(::dlsym(library, #name)); \
  if (api->name == nullptr) return missing_symbol(#name);
  MONARCH_UCX_FUNCTIONS(MONARCH_UCX_RESOLVE)
#undef MONARCH_UCX_RESOLVE
  return api.release();  // Never freed: see the header's lifetime note.
}

}  // namespace

absl::StatusOr<const UcxApi*> LoadUcx() {
  // A function-local static is initialized once, by the first caller, while
  // concurrent callers wait (C++11); it is never destroyed, since peers may
  // still be shutting down while static destructors run.
  static const auto* const loaded = new absl::StatusOr<const UcxApi*>(Load());
  return *loaded;
}

}  // namespace monarch
