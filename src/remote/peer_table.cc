// PeerTable: peer state and the network's lock. See peer_table.h.

#include "remote/peer_table.h"

#include "common/log.h"

namespace monarch {

PeerTable::PeerTable(int size, double retry_after_seconds)
    : retry_after_seconds_(retry_after_seconds), peers_(size) {}

bool PeerTable::IsUp(int rank) const {
  MutexLock lock(&mu_);
  return UpLocked(rank);
}

bool PeerTable::UpLocked(int rank) const { return Clock::now() >= peers_[rank].down_until; }

bool PeerTable::IsLost(int rank) const {
  MutexLock lock(&mu_);
  return LostLocked(rank);
}

bool PeerTable::LostLocked(int rank) const { return peers_[rank].lost; }

bool PeerTable::HasLeft(int rank) const {
  MutexLock lock(&mu_);
  return peers_[rank].departed;
}

void PeerTable::MarkDownLocked(int rank, absl::string_view why) {
  const bool was_up = UpLocked(rank);
  peers_[rank].down_until = Clock::now() + SecondsToDuration(retry_after_seconds_);
  peers_[rank].lost = true;
  if (was_up && !peers_[rank].departed) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    MONARCH_LOG(kWarning, "peer ", rank, " ", why, "; its files go to the next rank of their ",
                "order for ", retry_after_seconds_, " s");
  }
  listener_->OnPeerDownLocked(rank);
}

void PeerTable::MarkLeft(int rank) {
  {
    MutexLock lock(&mu_);
    peers_[rank].departed = true;
    MarkDownLocked(rank, "left");
  }
  MONARCH_LOG(kInfo, "peer ", rank, " left; its files go to the next rank of their order");
}

void PeerTable::HeardFromLocked(int rank) {
  peers_[rank].lost = false;
  peers_[rank].departed = false;
}

}  // namespace monarch
