// PeerTable: the job's other processes as this one sees them (up or down,
// lost, left), and the one lock of the peer network.
//
// A peer is marked down when it fails (an endpoint error, a request that
// timed out or could not be sent) or says goodbye, until `retry_after`:
// meanwhile reads go to the next rank of each file's order, and the first
// fetch after that time tries it again (DESIGN.md, "Coming back"). A peer is
// lost from when it is marked down until it answers again (unlike "down",
// not reset when its retry time comes), and has left if it said goodbye
// before that. Only failures count (remote.peer_failures).
//
// The lock. The network's parts (UcxWorker, PeerRequester, PeerServer, this
// table) share one mutex, so that what spans them stays one step: marking a
// peer down fails the fetches waiting on it and queues its endpoint's close;
// the progress loop decides to stop with one look at its queue and the
// replies in flight. It lives here because every part reaches the table.
// The parts name it `worker.mu()` (UcxWorker::mu() returns it), which Clang's
// thread-safety analysis resolves to this one lock. No other lock is held
// when it is taken; under it only the serve pool's queue and the log are
// entered.
//
// Lifetime: created first and destroyed last by PeerNetwork::Impl.
// Thread-safe: the *Locked methods need mu(); the others take it.

#ifndef MONARCH_REMOTE_PEER_TABLE_H_
#define MONARCH_REMOTE_PEER_TABLE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "common/shutdown.h"

namespace monarch {

// `seconds` (fractions allowed) as a Clock duration: the network's timeouts
// and retry delay.
inline Clock::duration SecondsToDuration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

class PeerTable {
 public:
  // Told when a peer is marked down: the requester fails the fetches still
  // waiting for that peer's answer. Called with mu() held, from whichever
  // thread marked it down.
  class Listener {
   public:
    virtual void OnPeerDownLocked(int rank) = 0;

   protected:
    ~Listener() = default;
  };

  PeerTable(int size, double retry_after_seconds);
  PeerTable(const PeerTable&) = delete;
  PeerTable& operator=(const PeerTable&) = delete;

  // The network's lock (see above).
  Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }

  // Set once, before the progress thread starts; it must outlive the table's use.
  void SetListener(Listener* listener) { listener_ = listener; }

  // False while `rank` is marked down (until its retry time).
  bool IsUp(int rank) const;
  bool UpLocked(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // From when `rank` is marked down until it answers again.
  bool IsLost(int rank) const;
  bool LostLocked(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `rank`, the last time it was lost, had said goodbye.
  bool HasLeft(int rank) const;

  // Marks `rank` down until retry_after and fails, through the listener, its
  // requests still waiting for an answer. A peer that was up and had not
  // said goodbye counts as a failure, logged with `why`.
  void MarkDownLocked(int rank, absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `rank` said goodbye: down like a failed peer (its files go to the next
  // rank, and it is tried again after retry_after, in case it comes back),
  // but not counted as a failure.
  void MarkLeft(int rank);
  // `rank` answered: whatever it was before, it is back.
  void HeardFromLocked(int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // remote.peer_failures: times a peer was marked down.
  uint64_t failures() const { return failures_.load(); }

 private:
  struct Peer {
    Clock::time_point down_until{};
    bool lost = false;      // Down, and not heard from since.
    bool departed = false;  // Said goodbye before it was lost.
  };

  const double retry_after_seconds_;
  mutable Mutex mu_;
  std::vector<Peer> peers_ ABSL_GUARDED_BY(mu_);
  Listener* listener_ = nullptr;
  std::atomic<uint64_t> failures_{0};
};

}  // namespace monarch

#endif  // MONARCH_REMOTE_PEER_TABLE_H_
