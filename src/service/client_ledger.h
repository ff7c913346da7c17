// ClientLedger: what the node service's clients read, per process, per job
// and for the node.
//
// Clients serve their hits themselves, counting them in their connection's
// counters page; the service counts the misses it serves them. A
// connection's counts live as long as the connection: when it closes, the
// ledger keeps them in the node's totals (which never go down) and in its
// job's. Jobs (Hello::job) are what `monarch status` lists: many jobs of a
// user may read one dataset through one service, each attaching with its
// processes' connections and detaching when the last one closes. The ledger
// keeps the jobs that left too (the last kMaxJobsLeft), so a job's reads can
// be read after it ended.
//
// Not thread-safe: the service calls it under its own mutex.

#ifndef MONARCH_SERVICE_CLIENT_LEDGER_H_
#define MONARCH_SERVICE_CLIENT_LEDGER_H_

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/counters.h"
#include "service/protocol.h"

namespace monarch::service {

// One connection's reads so far.
struct ConnectionReads {
  pid_t pid = 0;
  std::string job;
  const ClientCounters* counters = nullptr;  // Null: an administrative command.
  uint64_t misses = 0;
  uint64_t miss_bytes = 0;
  uint64_t source_bytes = 0;
};

class ClientLedger {
 public:
  static constexpr size_t kMaxJobsLeft = 32;

  // A client's connection said hello.
  void Attach(const std::string& job);
  // It closed: its reads stay counted.
  void Depart(const ConnectionReads& connection);

  // The node's reads as of now, given the open connections.
  struct Tally {
    TierReadTotals tiers[kMaxSharedTiers];  // Hits, by tier index.
    uint64_t source_fallbacks = 0;
    std::vector<ClientStats> clients;  // By pid.
    std::vector<JobStats> jobs;        // Attached ones by name, then those that left, latest first.
  };
  Tally Count(const std::vector<ConnectionReads>& open) const;

 private:
  struct Job {
    int connections = 0;
    JobStats departed;  // What its closed connections read.
  };
  static void Add(const ConnectionReads& connection, JobStats& job);

  TierReadTotals departed_tiers_[kMaxSharedTiers];
  uint64_t departed_fallbacks_ = 0;
  absl::flat_hash_map<std::string, Job> attached_;
  std::deque<JobStats> left_;  // Latest first.
};

}  // namespace monarch::service

#endif  // MONARCH_SERVICE_CLIENT_LEDGER_H_
