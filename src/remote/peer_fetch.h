// PeerFetch: the remote tier. Sits between the local tiers and the source.
//
// Every dataset file has a home rank (rendezvous hashing over the peers).
// A file no local tier holds is fetched from its home, unless this process
// is the home or the home is marked down; then, and whenever the home fails
// to deliver, it is read from the source. The home serves requests through
// its own read path, so it reads each file from the PFS once (concurrent
// requests share one promotion) and keeps it.
//
// Lifecycle: Create() (resolves rank and size, assigns homes), then the
// caller builds its placement handler, then Connect() (meets the peers and
// starts serving: requests arrive from then on), Shutdown() before the
// placement handler goes away.

#ifndef MONARCH_REMOTE_PEER_FETCH_H_
#define MONARCH_REMOTE_PEER_FETCH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/counters.h"
#include "metadata/namespace.h"
#include "monarch/config.h"
#include "monarch/stats.h"
#include "placement/fetch_source.h"
#include "placement/placement_policy.h"
#include "remote/peer_network.h"

namespace monarch {

class PeerFetch final : public FetchSource {
 public:
  static absl::StatusOr<std::unique_ptr<PeerFetch>> Create(const RemoteConfig& config,
                                                           const Namespace* ns, Tier* source);
  ~PeerFetch() override;

  // Meets the peers (blocks until all have arrived or the rendezvous times
  // out) and serves their requests with `serve` from then on.
  absl::Status Connect(PeerNetwork::ServeFn serve);
  void Shutdown();

  absl::StatusOr<size_t> Fetch(const FileRef& file, uint64_t offset, char* dst, size_t n) override;

  // True if `file` may be served to a peer by this process: its home is us
  // and the peer's view of it (size, mtime) is ours.
  absl::Status CheckServable(const FileEntry* entry, const PeerNetwork::FileRequest& request) const;

  bool IsHome(uint32_t id) const { return homes_[id] == rank_; }

  // Wraps `inner` so that copies of files homed elsewhere (DYAD-style
  // inclusive copies) never take room this process needs for its own home
  // files: without eviction, they would otherwise crowd out the share the
  // peers rely on it to keep.
  std::unique_ptr<PlacementPolicy> WrapPolicy(std::unique_ptr<PlacementPolicy> inner);

  void ReportCounters(CounterSink& sink) const;

 private:
  PeerFetch(const RemoteConfig& config, const Namespace* ns, Tier* source, int rank, int size);

  const RemoteConfig config_;
  const Namespace* const ns_;
  Tier* const source_;
  const int rank_;
  const int size_;
  std::vector<uint16_t> homes_;  // By file id.
  uint64_t home_files_ = 0;
  uint64_t buffer_bytes_ = 0;
  std::unique_ptr<PeerNetwork> network_;  // Null until Connect() (and when alone).
  std::string rendezvous_dir_;            // Expanded; empty with MPI.

  std::atomic<uint64_t> peer_reads_{0};
  std::atomic<uint64_t> peer_bytes_{0};
  std::atomic<uint64_t> fallbacks_{0};
  std::atomic<uint64_t> down_skips_{0};
  std::atomic<uint64_t> wait_ns_{0};
};

}  // namespace monarch

#endif  // MONARCH_REMOTE_PEER_FETCH_H_
