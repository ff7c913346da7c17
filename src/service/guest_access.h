// Which files a guest may read through the service.
//
// With node.share_with_group, members of the group other than the
// service's own user connect as guests (HelloReply::guest). The service
// reads the source as its own user, who may read files a guest may not;
// so a guest gets a file's bytes only after proving it could open the file
// itself: it opens the file on the source and passes the descriptor
// (kProveAccess). Opening is where the kernel applies the file's mode, its
// ACLs and the file system's own checks, so the service judges nothing but
// that the descriptor is readable and is that file.
//
// Grants are per client process and last until its last connection
// closes, as an open file's access lasts until it is closed: a chmod after
// the proof does not revoke it, as it would not revoke an open descriptor.

#ifndef MONARCH_SERVICE_GUEST_ACCESS_H_
#define MONARCH_SERVICE_GUEST_ACCESS_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/mutex.h"
#include "metadata/namespace.h"

namespace monarch::service {

class GuestAccess {
 public:
  // `name_space`: the service's, whose root and names locate the source files.
  explicit GuestAccess(const Namespace& name_space) : name_space_(name_space) {}

  // Grants `file_id` (below file_count()) to process `pid` if `fd` is open
  // for reading and is that file on the source. PermissionDenied otherwise,
  // with the reason; counted in refusals().
  absl::Status Prove(pid_t pid, uint32_t file_id, int fd);
  // Whether `pid` proved the file an entry (a file, or one of its extents)
  // belongs to. A refusal is counted.
  bool Granted(pid_t pid, uint32_t entry_id);
  // The process's last connection closed.
  void Forget(pid_t pid);

  // Proofs and reads refused.
  uint64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

 private:
  absl::Status Refuse(absl::string_view why);

  const Namespace& name_space_;
  Mutex mu_;
  absl::flat_hash_map<pid_t, absl::flat_hash_set<uint32_t>> granted_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> refusals_{0};
};

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_GUEST_ACCESS_H_
