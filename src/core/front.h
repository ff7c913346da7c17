// Front: the half of a Monarch that does not care where it runs, written
// once for the in-process instance (core/monarch_core.cc) and the node
// service's client (service/client.cc), as the VFS's generic code sits over
// each file system's address_space_operations.
//
// Name lookup, stat(), directory calls, announcements and the speed model's
// stats are here, over a NamespaceView (the namespace itself, or the
// service's shared image of it). An adapter supplies the rest: the reads
// (core/read_path.h, over its own Files), what it does with an order once
// the names are ids, and the node's counters.

#ifndef MONARCH_CORE_FRONT_H_
#define MONARCH_CORE_FRONT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "core/read_speeds.h"
#include "metadata/namespace.h"
#include "monarch/monarch.h"

namespace monarch {

class Front : public Monarch {
 public:
  absl::StatusOr<uint64_t> FileSize(std::string_view name) const override;
  absl::StatusOr<FileStat> Stat(std::string_view name) const override;
  bool FileExists(std::string_view name) const override;
  bool IsDirectory(std::string_view name) const override;
  absl::StatusOr<std::vector<std::string>> ListDirectory(std::string_view dir) const override;
  std::vector<std::string> ListFiles() const override;
  // The node's counters, then this process's speed model's.
  Stats GetStats() const override;
  absl::Status AnnounceOrder(const std::vector<std::string>& names) override;
  absl::Status AnnounceRanges(const std::vector<SampleRange>& samples) override;

 protected:
  // The names as this process sees them now; null when it cannot (a client
  // with no session). Valid while this Monarch is.
  virtual const NamespaceView* View() const = 0;
  // An order of file ids (`ranges` empty) or of samples, its ids `view`'s.
  // Aborted: `view` is no longer current, and the names are looked up again.
  virtual absl::Status AnnounceIds(const NamespaceView& view, std::vector<uint32_t> ids,
                                   std::vector<FileRange> ranges) = 0;
  // The node's counters (this process's, in process).
  virtual Stats NodeStats() const = 0;
  // This process's speed model (placement.route_by_speed), or null.
  virtual const ReadSpeeds* Speeds() const = 0;

 private:
  // Looks `count` names up in the current view and hands their ids to
  // AnnounceIds (as samples' if `samples`), again if the view changed.
  absl::Status Announce(size_t count, absl::FunctionRef<absl::string_view(size_t)> name,
                        const std::vector<SampleRange>* samples);
};

}  // namespace monarch

#endif  // MONARCH_CORE_FRONT_H_
