// What the node service's clients read.

#include "service/client_ledger.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_set.h"

namespace monarch::service {

void ClientLedger::Attach(const std::string& job) { ++attached_[job].connections; }

void ClientLedger::Add(const ConnectionReads& connection, JobStats& job) {
  job.misses += connection.misses;
  job.miss_bytes += connection.miss_bytes;
  job.source_bytes += connection.source_bytes;
  if (connection.counters == nullptr) return;
  for (const TierReads& tier : connection.counters->tiers) {
    job.hits += tier.reads.load(std::memory_order_relaxed);
    job.hit_bytes += tier.bytes.load(std::memory_order_relaxed);
  }
}

void ClientLedger::Depart(const ConnectionReads& connection) {
  if (const ClientCounters* counters = connection.counters) {
    for (int t = 0; t < kMaxSharedTiers; ++t) {
      departed_tiers_[t].reads += counters->tiers[t].reads.load(std::memory_order_relaxed);
      departed_tiers_[t].bytes += counters->tiers[t].bytes.load(std::memory_order_relaxed);
    }
    departed_fallbacks_ += counters->source_fallbacks.load(std::memory_order_relaxed);
  }
  auto job = attached_.find(connection.job);
  if (job == attached_.end()) return;  // An administrative command: no hello.
  Add(connection, job->second.departed);
  if (--job->second.connections > 0) return;
  // The job's last connection: it left.
  JobStats left = job->second.departed;
  left.name = connection.job;
  left.processes = 0;
  attached_.erase(job);
  left_.push_front(std::move(left));
  if (left_.size() > kMaxJobsLeft) left_.pop_back();
}

ClientLedger::Tally ClientLedger::Count(const std::vector<ConnectionReads>& open) const {
  Tally tally;
  std::copy(std::begin(departed_tiers_), std::end(departed_tiers_), std::begin(tally.tiers));
  tally.source_fallbacks = departed_fallbacks_;
  std::map<pid_t, ClientStats> clients;
  std::map<std::string, JobStats> jobs;
  for (const auto& [name, job] : attached_) {
    jobs[name] = job.departed;
    jobs[name].name = name;
  }
  absl::flat_hash_set<std::pair<std::string, pid_t>> processes;
  for (const ConnectionReads& c : open) {
    if (c.counters == nullptr) continue;  // An administrative command.
    ClientStats& client = clients[c.pid];
    client.pid = static_cast<uint32_t>(c.pid);
    ++client.connections;
    client.misses += c.misses;
    client.miss_bytes += c.miss_bytes;
    tally.source_fallbacks += c.counters->source_fallbacks.load(std::memory_order_relaxed);
    for (int t = 0; t < kMaxSharedTiers; ++t) {
      const uint64_t reads = c.counters->tiers[t].reads.load(std::memory_order_relaxed);
      const uint64_t bytes = c.counters->tiers[t].bytes.load(std::memory_order_relaxed);
      tally.tiers[t].reads += reads;
      tally.tiers[t].bytes += bytes;
      client.hits += reads;
      client.hit_bytes += bytes;
    }
    auto job = jobs.find(c.job);
    if (job == jobs.end()) continue;
    Add(c, job->second);
    if (processes.insert({c.job, c.pid}).second) ++job->second.processes;
  }
  for (auto& [pid, client] : clients) tally.clients.push_back(client);
  for (auto& [name, job] : jobs) tally.jobs.push_back(std::move(job));
  tally.jobs.insert(tally.jobs.end(), left_.begin(), left_.end());
  return tally;
}

}  // namespace monarch::service
