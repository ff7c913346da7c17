// PeerDriver: the peers tier. Sits between the cache tiers and the source.
//
// Every dataset file has a home rank (rendezvous hashing over the peers).
// A read of a file no cache tier holds asks the peers tier first: it fetches
// the file from its home, unless this process is the home or the home is
// marked down; then it answers NotFound and the read goes on to the source,
// as it does when the home fails to deliver. The home serves requests
// through its own read path, so it reads each file from the PFS once
// (concurrent requests share one promotion) and keeps it.
//
// Read-only: NewWriter and Remove are refused, like the source's.
//
// Lifecycle: Create() (resolves rank and size, assigns homes), then the
// instance puts it in its tier list and builds its placement handler, then
// Connect() (meets the peers and starts serving: requests arrive from then
// on), Shutdown() before the placement handler goes away.

#ifndef MONARCH_REMOTE_PEER_DRIVER_H_
#define MONARCH_REMOTE_PEER_DRIVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/counters.h"
#include "drivers/storage_driver.h"
#include "metadata/namespace.h"
#include "monarch/config.h"
#include "placement/placement_policy.h"
#include "remote/peer_network.h"

namespace monarch {

class PeerDriver final : public StorageDriver {
 public:
  static absl::StatusOr<std::unique_ptr<PeerDriver>> Create(const RemoteConfig& config,
                                                            const Namespace* ns);
  ~PeerDriver() override;

  // Meets the peers (blocks until all have arrived or the rendezvous times
  // out) and serves their requests with `serve` from then on.
  absl::Status Connect(PeerNetwork::ServeFn serve);
  void Shutdown();

  // StorageDriver. Read: the bytes from the file's home, or NotFound when
  // no peer is asked (alone, this process is the home, the home is down),
  // or the peer's error when it failed to deliver.
  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n) override;
  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) override;
  absl::Status Remove(const FileRef& file) override;

  // True if `file` may be served to a peer by this process: its home is us
  // and the peer's view of it (size, mtime) is ours.
  absl::Status CheckServable(const FileEntry* entry, const PeerNetwork::FileRequest& request) const;

  bool IsHome(uint32_t id) const { return homes_[id] == rank_; }

  // The files this process is home of, for the placement policy: they get
  // room before copies of files homed elsewhere (DYAD-style inclusive
  // copies), which would otherwise crowd out the share the peers rely on it
  // to keep. Call after the warm-restart scan: files already in a tier are
  // not pending.
  KeptShare HomeShare() const;

  void ReportCounters(CounterSink& sink) const;

 private:
  PeerDriver(const RemoteConfig& config, const Namespace* ns, int rank, int size);

  const RemoteConfig config_;
  const Namespace* const ns_;
  const int rank_;
  const int size_;
  std::vector<uint16_t> homes_;  // By file id.
  uint64_t home_files_ = 0;
  uint64_t buffer_bytes_ = 0;
  std::unique_ptr<PeerNetwork> network_;  // Null until Connect() (and when alone).
  std::string rendezvous_dir_;            // Expanded; empty with MPI.

  std::atomic<uint64_t> fallbacks_{0};
  std::atomic<uint64_t> down_skips_{0};
  std::atomic<uint64_t> wait_ns_{0};
};

}  // namespace monarch

#endif  // MONARCH_REMOTE_PEER_DRIVER_H_
