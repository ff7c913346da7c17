// PeerServer: the home side of the peer network, answering peers' requests.
//
// A request is checked for the job's secret (answered UNAUTHENTICATED
// without it, so that a stranger's requester reads the source at once) and
// handed to `serve`, the owner's read path. Bytes already in memory (a RAM
// copy) are answered right on the progress thread, from where they rest,
// with the CRC32C of the copy's block sums: no thread hand-off, no pass over
// the bytes. Anything else is read by the serve pool (remote.serve_threads)
// into a staging buffer registered once (two per serve thread), which it
// checksums. Either way the reply is sent by the progress thread; the
// requester checks the CRC, so bytes that change after they were taken (a
// RAM copy removed, its memory reused) are never accepted. Requests that
// come before StartServing() are held, not refused: a faster peer may ask
// while this one is still connecting.
//
// Lifetime: created by PeerNetwork::Impl after the worker, which it uses;
// RegisterBuffers() once before the progress thread starts; StartServing()
// once the owner's state that `serve` reads is complete; StopServing() at
// shutdown, before the worker stops.
//
// Threads: requests arrive on the progress thread (OnMessage), which also
// sends the replies (SendReply, FinishReply); the serve pool reads
// (Serve). StartServing, StopServing and the counters may be called from
// any thread. The state they share is under the network's lock (worker.mu()).

#ifndef MONARCH_REMOTE_PEER_SERVER_H_
#define MONARCH_REMOTE_PEER_SERVER_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "common/shutdown.h"
#include "common/thread_pool.h"
#include "remote/peer_network.h"
#include "remote/ucx_worker.h"

namespace monarch {

class PeerServer final : public UcxWorker::MessageHandler {
 public:
  // `options` (rank, size, buffer and chunk sizes, serve threads, the
  // request timeout) and `secret` must outlive the server; `secret` is set
  // before the progress thread starts, read-only after.
  PeerServer(UcxWorker& worker, const PeerNetwork::Options& options, const std::string& secret,
             PeerNetwork::ServeFn serve);
  PeerServer(const PeerServer&) = delete;
  PeerServer& operator=(const PeerServer&) = delete;

  // Registers the staging buffers (UcxWorker::RegisterRegion's errors).
  absl::Status RegisterBuffers();

  // Serves the requests held so far and every later one. Once.
  void StartServing();

  // Refuses the held requests and every later one, then waits until
  // `deadline` for those being served. False if one was still being read
  // then (a file system that stopped answering): the network must be
  // abandoned, not destroyed.
  bool StopServing(Deadline deadline);
  // Waits until `deadline` for requests still being served, after
  // StopServing() (or when the worker never started): a later Shutdown.
  // It holds the network's lock while it waits, as the network always has,
  // so a serve task that ends meanwhile queues its reply only afterwards.
  bool WaitForServes(Deadline deadline);

  struct Counters {
    uint64_t requests_served;
    uint64_t bytes_served;
    uint64_t requests_refused;
    uint64_t requests_unauthenticated;
    uint64_t requests_held;  // Now, until StartServing().
  };
  Counters counters() const;

 private:
  class Reply;  // A reply being sent.

  // A request (UcxWorker::MessageHandler), on the progress thread.
  void OnMessage(const UcxWorker::Message& request) override;
  // Progress thread: answers a request whose bytes are in memory; false if
  // it did not.
  bool ServeFromMemory(const peer_wire::RequestHeader& request, absl::string_view name);
  // Serve pool thread: finds the bytes and queues the reply.
  void Serve(const peer_wire::RequestHeader& request, const std::string& name);

  void QueueRefusal(const peer_wire::RequestHeader& request, absl::StatusCode code);
  // `data`: the bytes to send with an OK reply (from staging buffer
  // `send_buffer`, or -1 when they are sent from where they rest).
  void QueueReplyLocked(const peer_wire::RequestHeader& request, absl::StatusCode code,
                        const char* data, int send_buffer, uint64_t checksum)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(worker_.mu());
  // ---- Progress thread ----
  void SendReply(Reply* reply, int to);
  void FinishReply(Reply* reply, bool sent);  // Deletes the reply.

  UcxWorker& worker_;
  const PeerNetwork::Options& options_;
  const std::string& secret_;
  const PeerNetwork::ServeFn serve_;
  const uint64_t send_bytes_;  // One staging buffer: max(buffer, chunk).
  const UcxWorker::Region* send_region_ = nullptr;  // Set by RegisterBuffers().

  CondVar send_buffer_freed_;  // A staging buffer became free.
  std::vector<int> free_send_buffers_ ABSL_GUARDED_BY(worker_.mu());
  enum class Serving { kHeld, kOn, kOff };
  Serving serving_ ABSL_GUARDED_BY(worker_.mu()) = Serving::kHeld;
  std::vector<std::pair<peer_wire::RequestHeader, std::string>> held_
      ABSL_GUARDED_BY(worker_.mu());

  std::atomic<uint64_t> requests_served_{0};
  std::atomic<uint64_t> bytes_served_{0};
  std::atomic<uint64_t> requests_refused_{0};
  std::atomic<uint64_t> requests_unauthenticated_{0};

  ThreadPool serve_pool_;
};

}  // namespace monarch

#endif  // MONARCH_REMOTE_PEER_SERVER_H_
