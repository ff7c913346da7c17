// ServiceClient: a Monarch served by the node's service.

#include "service/client.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/copy_bytes.h"
#include "common/counters.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/os.h"
#include "common/shared_memory.h"
#include "common/status_macros.h"
#include "core/front.h"
#include "core/read_path.h"
#include "core/read_speeds.h"
#include "drivers/storage_driver.h"
#include "metadata/namespace.h"
#include "placement/scan_rule.h"
#include "service/namespace_image.h"
#include "service/protocol.h"
#include "service/runtime.h"
#include "service/unix_socket.h"

namespace monarch::service {
namespace {

using Clock = std::chrono::steady_clock;

absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Bumped in every child right after fork(): a client notices it is in a new
// process with one atomic load, not a getpid() system call per read.
std::atomic<uint64_t> fork_generation{0};
void CountFork() { fork_generation.fetch_add(1, std::memory_order_relaxed); }

// A connection's first answer: what the service shares, with descriptors.
struct Hello {
  ScopedFd socket;
  HelloReply reply;
  std::vector<ScopedFd> fds;
};

// `timeout`: how long this connection waits for any reply (node.request_timeout);
// a receive that times out fails, and the caller drops the connection.
absl::StatusOr<Hello> SayHello(const std::string& socket_path, const DatasetConfig& dataset,
                               double timeout) {
  MONARCH_ASSIGN_OR_RETURN(ScopedFd socket, ConnectUnix(socket_path, timeout));
  service::Hello hello;
  hello.dataset_root = dataset.path;
  hello.dataset_key = DatasetKey(dataset);
  static const std::string* const job = new std::string(ThisJobName());
  hello.job = *job;
  MONARCH_ASSIGN_OR_RETURN(
      Frame frame, Call(socket.get(), MessageType::kHello, Encode(hello), kMaxDescriptors));
  if (frame.type != MessageType::kHelloReply) {
    return absl::InternalError("the Monarch service answered hello with something else");
  }
  MONARCH_ASSIGN_OR_RETURN(HelloReply reply, DecodeHelloReply(frame.payload));
  if (frame.fds.size() != reply.TotalDescriptors()) {
    return absl::InternalError("the Monarch service sent the wrong number of descriptors");
  }
  return Hello{std::move(socket), std::move(reply), std::move(frame.fds)};
}

// One service instance as this process maps it.
struct Session {
  HelloReply reply;
  std::vector<ScopedFd> fds;  // Kept: a forked child maps them again.
  std::unique_ptr<NamespaceImage> image;
  MappedRegion tier_slots;
  // Per tier: a driver reading its copies here, or null (peers, source).
  std::vector<std::unique_ptr<StorageDriver>> readers;
  int source_index = 0;
  std::atomic<bool> alive{true};

  // The source, for reads while no service answers and the speed model's:
  // a session's own, as its descriptors are cached by this session's ids.
  // Opened on first use: a client that never needs it asks nothing of the
  // PFS (opening its root is a lookup there) when it opens Monarch.
  StorageDriver& Source() {
    absl::call_once(source_once, [this] {
      source = NewSourceDriver(reply.dataset_root,
                               std::max<int>(1, static_cast<int>(reply.max_open_files)));
    });
    return *source;
  }
  absl::once_flag source_once;            // Through Source() only.
  std::unique_ptr<StorageDriver> source;  // Through Source() only.

  const TierSlot& slot(uint32_t id) const {
    return reinterpret_cast<const TierSlot*>(tier_slots.data())[id];
  }

  // A guest's files the service took its proof of access for
  // (ProveAccessRequest): this process's, as the service's grants are.
  bool Proven(uint32_t id) {
    MutexLock lock(&proven_mu);
    return proven.contains(id);
  }
  void MarkProven(uint32_t id) {
    MutexLock lock(&proven_mu);
    proven.insert(id);
  }
  Mutex proven_mu;
  absl::flat_hash_set<uint32_t> proven ABSL_GUARDED_BY(proven_mu);
};

// `fds`: the image, the tier slots, then each tier's (not the transfer
// buffer, which belongs to a connection).
absl::StatusOr<std::unique_ptr<Session>> MapSession(const HelloReply& reply,
                                                   std::vector<ScopedFd> fds, VerifyPolicy verify) {
  auto session = std::make_unique<Session>();
  session->reply = reply;
  MONARCH_ASSIGN_OR_RETURN(session->image, NamespaceImage::Open(fds[0]));
  if (session->image->file_count() != reply.file_count) {
    return absl::InternalError("namespace image and hello disagree on the file count");
  }
  // A slot per entry: the files', then their extents' (read here too).
  const uint32_t entries = session->image->entry_count();
  MONARCH_ASSIGN_OR_RETURN(session->tier_slots, MappedRegion::Map(fds[1].get(), false));
  if (session->tier_slots.size() < uint64_t{entries} * sizeof(TierSlot)) {
    return absl::InternalError("tier slots smaller than the namespace");
  }
  session->source_index = static_cast<int>(reply.tiers.size()) - 1;
  if (session->source_index < 0 || reply.tiers.size() > static_cast<size_t>(kMaxSharedTiers)) {
    return absl::InternalError("the Monarch service described no usable tiers");
  }
  if (reply.guest) {
    // Another user's service: no copy is read here, every read is a miss
    // (SessionFiles::Miss proves access first).
    if (reply.TotalDescriptors() != HelloReply::kFixedDescriptors) {
      return absl::InternalError("the Monarch service sent a guest its tiers' descriptors");
    }
    session->readers.resize(reply.tiers.size());
    session->fds = std::move(fds);
    return session;
  }
  size_t next = 2;
  const int max_open = std::max<int>(1, static_cast<int>(reply.max_open_files));
  for (const TierDescription& tier : reply.tiers) {
    std::vector<ScopedFd> tier_fds;
    for (uint32_t i = 0; i < tier.descriptors; ++i) {
      MONARCH_ASSIGN_OR_RETURN(ScopedFd copy, ReopenReadOnly(fds[next + i].get()));
      tier_fds.push_back(std::move(copy));
    }
    next += tier.descriptors;
    std::unique_ptr<StorageDriver> reader;
    switch (static_cast<TierKind>(tier.kind)) {
      case TierKind::kRam: {
        // A process forked from a client is most likely one of the job's
        // workers (a DataLoader's, which PyTorch starts for each epoch): it
        // copies with pread() until it reads a file again (RamReader). The
        // process that was not forked maps from the start.
        const bool map_from_start =
            tier.huge_pages || fork_generation.load(std::memory_order_relaxed) == 0;
        MONARCH_ASSIGN_OR_RETURN(reader, NewRamReader(std::move(tier_fds), entries,
                                                      map_from_start));
        break;
      }
      case TierKind::kPosix: {
        PosixWriteOptions options;  // Only read: the service writes the copies.
        options.verify = verify;
        reader = NewPosixDriver(tier.path, max_open, options);
        break;
      }
      case TierKind::kPmem:
        reader = NewPmemDriver(tier.path, max_open, verify);
        break;
      case TierKind::kSource:
      case TierKind::kPeers:
        break;  // Asked of the service.
    }
    session->readers.push_back(std::move(reader));
  }
  session->fds = std::move(fds);
  return session;
}

// What the fds of a hello map as a session: all but the transfer buffer.
std::vector<ScopedFd> SessionFds(std::vector<ScopedFd>& fds) {
  std::vector<ScopedFd> out;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (i != 2) out.push_back(std::move(fds[i]));
  }
  return out;
}

// A connection to the service with its transfer buffer.
struct Channel {
  ScopedFd socket;
  MappedRegion buffer;  // Counters page, then the transfer buffer.
  Session* session = nullptr;
  const char* transfer() const { return buffer.data() + kCountersPageBytes; }
};

// Everything that belongs to one process: after fork() a child builds its
// own and never touches its parent's (whose mutexes another thread may have
// held at the fork).
struct ProcessState {
  // `tiers`: the service's, for the speed model (placement.route_by_speed).
  ProcessState(uint64_t generation, const Config& config, const std::vector<TierDescription>& tiers)
      : generation(generation) {
    std::vector<ReadSpeeds::TierName> names;
    for (const TierDescription& tier : tiers) {
      names.push_back({tier.name, static_cast<TierKind>(tier.kind)});
    }
    speeds = ReadSpeeds::For(config.placement.route_by_speed, std::move(names));
  }
  const uint64_t generation;
  std::unique_ptr<ReadSpeeds> speeds;  // Null unless placement.route_by_speed applies.
  std::atomic<Session*> session{nullptr};
  std::atomic<ClientCounters*> counters{&local_counters};
  ClientCounters local_counters{};  // Until the first connection's page exists.

  Mutex mu;
  std::vector<std::unique_ptr<Session>> sessions ABSL_GUARDED_BY(mu);  // Current and retired.
  std::vector<std::unique_ptr<Channel>> idle ABSL_GUARDED_BY(mu);
  MappedRegion counters_page ABSL_GUARDED_BY(mu);
  Clock::time_point next_connect ABSL_GUARDED_BY(mu);
  Clock::time_point next_autostart ABSL_GUARDED_BY(mu);

  // Files this process started reading, not yet told to the service (for
  // the prefetch lookahead; see NoteFirstRead).
  Mutex consumed_mu;
  std::vector<uint32_t> consumed ABSL_GUARDED_BY(consumed_mu);
  Clock::time_point consumed_sent ABSL_GUARDED_BY(consumed_mu);
  // The notices' own connection: no handshake (a notice needs none), so a
  // DataLoader worker that only hits never pays for a session of its own.
  ScopedFd notice_socket ABSL_GUARDED_BY(consumed_mu);

  // This process's scans of files cached by extents (see NoteReading).
  struct Scan {
    uint64_t start = 0;
    uint64_t end = 0;
    uint64_t told_extent = ~uint64_t{0};  // The extent a notice was last sent from.
  };
  Mutex scans_mu;
  absl::flat_hash_map<uint32_t, Scan> scans ABSL_GUARDED_BY(scans_mu);
};

// First reads are told to the service in batches: one message, not
// answered, per this many files, or sooner once this long has passed (a
// DataLoader worker may read only a few dozen files before it exits).
constexpr size_t kConsumedBatch = 64;
constexpr auto kConsumedDelay = std::chrono::milliseconds(20);

constexpr size_t kMaxIdleChannels = 16;

// The client's ProcessState in each process that uses it, and its
// sessions: a new service instance's hello makes a new current session.
class ClientProcess {
 public:
  // Both must outlive this.
  ClientProcess(const Config& config, const ServicePaths& paths) : config_(config), paths_(paths) {}

  ~ClientProcess() {
    ProcessState* state = state_.load();
    // Only the process that made the state owns it; a forked child's copies
    // of its parent's states are left alone (their mutexes may be held).
    if (state != nullptr && state->generation == fork_generation.load()) delete state;
  }

  // The first session, from the service's first hello.
  absl::Status Start(Hello hello) {
    static absl::once_flag once;
    absl::call_once(once, [] { ::pthread_atfork(nullptr, nullptr, CountFork); });
    root_ = hello.reply.dataset_root;
    auto* state = new ProcessState(fork_generation.load(), config_, hello.reply.tiers);
    state_.store(state);
    MutexLock lock(&state->mu);
    return AdoptLocked(*state, std::move(hello));
  }
  const std::string& root() const { return root_; }

  // This process's state. A forked child makes its own on its first call.
  ProcessState& State() const {
    ProcessState* state = state_.load(std::memory_order_acquire);
    const uint64_t generation = fork_generation.load(std::memory_order_relaxed);
    if (state->generation == generation) return *state;
    // A forked child: its own state, built from what the parent's session
    // keeps immutable (the reply and the descriptors, mapped again here).
    const Session* inherited = state->session.load();
    auto* fresh = new ProcessState(
        generation, config_,
        inherited != nullptr ? inherited->reply.tiers : std::vector<TierDescription>());
    // Its hits go on counting in the parent's counters page (a shared
    // mapping the child inherited): a DataLoader worker that only hits
    // still shows in the node's stats, with no connection of its own.
    fresh->counters.store(state->counters.load());
    if (inherited != nullptr) {
      std::vector<ScopedFd> fds;
      // The RAM tier's memfds, no file: outside the seam of common/os.h.
      for (const ScopedFd& fd : inherited->fds) fds.emplace_back(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
      absl::StatusOr<std::unique_ptr<Session>> session = MapSession(inherited->reply, std::move(fds), verify());
      if (session.ok()) {
        MutexLock lock(&fresh->mu);
        fresh->session.store(session->get());
        fresh->sessions.push_back(std::move(*session));
      }
    }
    if (state_.compare_exchange_strong(state, fresh)) return *fresh;  // Parent's: left as is.
    delete fresh;  // Another thread of the child got there first.
    return *state_.load();
  }

  // The current session; for a child whose inherited session could not be
  // mapped, a new connection's. Null when no service answers.
  Session* CurrentSession(ProcessState& state) const {
    Session* session = state.session.load(std::memory_order_acquire);
    if (session != nullptr) return session;
    // A child whose inherited session could not be mapped: connect now.
    MutexLock lock(&state.mu);
    if (Session* current = state.session.load()) return current;
    absl::StatusOr<Hello> hello = SayHelloToService();
    if (hello.ok() && AdoptLocked(state, std::move(*hello)).ok()) return state.session.load();
    return nullptr;
  }

  // Makes a new service instance's hello the current session; its
  // connection becomes an idle channel (and the counters' home).
  absl::Status AdoptLocked(ProcessState& state, Hello hello) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
    MONARCH_ASSIGN_OR_RETURN(MappedRegion buffer, MappedRegion::Map(hello.fds[2].get(), true));
    if (buffer.size() < kCountersPageBytes + hello.reply.buffer_bytes) {
      return absl::InternalError("transfer buffer smaller than announced");
    }
    MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<Session> session,
                             MapSession(hello.reply, SessionFds(hello.fds), verify()));
    if (Session* old = state.session.load()) old->alive.store(false);
    state.idle.clear();  // Channels of the old instance.
    // This connection's counters page carries the process's hits from now
    // on. The old page is kept mapped: readers may still hold its pointer.
    auto channel = std::make_unique<Channel>();
    channel->socket = std::move(hello.socket);
    channel->session = session.get();
    MONARCH_ASSIGN_OR_RETURN(MappedRegion page, MappedRegion::Map(hello.fds[2].get(), true));
    channel->buffer = std::move(buffer);
    state.counters.store(reinterpret_cast<ClientCounters*>(page.data()));
    retired_pages_.push_back(std::move(state.counters_page));
    state.counters_page = std::move(page);
    state.idle.push_back(std::move(channel));
    state.session.store(session.get(), std::memory_order_release);
    state.sessions.push_back(std::move(session));
    return absl::OkStatus();
  }

  // A new connection to this config's service, past its handshake.
  absl::StatusOr<Hello> SayHelloToService() const {
    return SayHello(paths_.socket, config_.dataset, config_.node.request_timeout_seconds);
  }

 private:
  // How this process checks the file tiers' copies it reads itself.
  VerifyPolicy verify() const { return config_.placement.verify; }

  const Config& config_;
  const ServicePaths& paths_;
  std::string root_;  // Set in Start(), then read-only.
  mutable std::atomic<ProcessState*> state_{nullptr};
  // Counter pages of replaced connections: hits in flight may still count there.
  mutable std::vector<MappedRegion> retired_pages_;
};

// The client's channels to its service: connections with their transfer
// buffers, kept idle for the next request, and the reconnection when the
// service goes away, starting a new one where node.autostart says so.
// One-way notices go on a connection of their own.
class ChannelPool {
 public:
  // All must outlive this.
  ChannelPool(const ClientProcess& process, const Config& config, const ConfigSource& source,
              const ServicePaths& paths)
      : process_(process), config_(config), source_(source), paths_(paths) {}

  // Connects; when no service runs, starts one (node.autostart) and waits
  // while one is starting (it holds the lock from its first moment).
  absl::StatusOr<Hello> ConnectOrStart() const {
    absl::StatusOr<Hello> hello = process_.SayHelloToService();
    if (hello.ok() || !(absl::IsNotFound(hello.status()) || absl::IsUnavailable(hello.status()))) {
      return hello;
    }
    if (!config_.node.autostart) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no Monarch service runs at ", paths_.socket,
          ": start one with `monarch serve --config FILE`, or set node.autostart: true"));
    }
    MONARCH_ASSIGN_OR_RETURN(std::string file, AutostartConfigFile());
    if (!ServiceLockHeld(paths_)) {
      if (const std::vector<std::string> others = OtherShapesRunning(config_, paths_);
          !others.empty()) {
        MONARCH_LOG(kWarning, "starting a Monarch service of this job's own for ",
                    config_.dataset.path, " in ", paths_.dir, ": the one(s) already reading it (",
                    absl::StrJoin(others, ", "), ") have other tiers than this config's (",
                    CacheShape(config_), "). Jobs share one service, and one copy of the "
                    "dataset, only when their configs give the same tiers.");
      }
      MONARCH_RETURN_IF_ERROR(StartServiceDetached(paths_, file));
    }
    const Clock::time_point began = Clock::now();
    Clock::time_point lock_last_seen = began;
    auto wait = std::chrono::milliseconds(5);
    for (;;) {
      std::this_thread::sleep_for(wait);
      wait = std::min(wait * 2, std::chrono::milliseconds(100));
      hello = process_.SayHelloToService();
      if (hello.ok() || !(absl::IsNotFound(hello.status()) || absl::IsUnavailable(hello.status()))) {
        return hello;
      }
      const Clock::time_point now = Clock::now();
      if (ServiceLockHeld(paths_)) lock_last_seen = now;
      // Nobody holds the lock for a while: the service we started is gone.
      if (now - lock_last_seen > std::chrono::seconds(5)) {
        return absl::UnavailableError(absl::StrCat("the Monarch service did not start (",
                                                   paths_.log, ": ", LogTail(paths_), ")"));
      }
      // Still starting (walking the dataset) after all this time: its file
      // system may have stopped answering.
      if (now - began > std::chrono::duration<double>(config_.node.start_timeout_seconds)) {
        return absl::DeadlineExceededError(absl::StrCat(
            "the Monarch service at ", paths_.socket, " is still starting after node.start_timeout (",
            config_.node.start_timeout_seconds, " s); ", paths_.log, ": ", LogTail(paths_)));
      }
    }
  }

  // An idle channel to `session`'s service, or a new connection. Null when
  // the service is unreachable; Aborted when a new service instance
  // answered (the session changed).
  absl::StatusOr<std::unique_ptr<Channel>> Take(ProcessState& state, Session* session) const {
    MutexLock lock(&state.mu);
    if (state.session.load() != session) return absl::AbortedError("session changed");
    if (session->alive.load() && !state.idle.empty()) {
      std::unique_ptr<Channel> channel = std::move(state.idle.back());
      state.idle.pop_back();
      return channel;
    }
    const Clock::time_point now = Clock::now();
    if (!session->alive.load() && now < state.next_connect) return std::unique_ptr<Channel>();
    absl::StatusOr<Hello> hello = process_.SayHelloToService();
    if (!hello.ok()) {
      if (session->alive.exchange(false)) {
        MONARCH_LOG(kWarning, "the Monarch service at ", paths_.socket, " is gone (",
                    hello.status().message(), "); reading from tier copies and the source");
      }
      state.next_connect = now + std::chrono::seconds(1);
      MaybeRestartService(state, now);
      return std::unique_ptr<Channel>();
    }
    if (hello->reply.instance_id != session->reply.instance_id) {
      MONARCH_LOG(kInfo, "reconnected to a new Monarch service (pid ", hello->reply.service_pid,
                  ")");
      MONARCH_RETURN_IF_ERROR(process_.AdoptLocked(state, std::move(*hello)));
      return absl::AbortedError("session changed");
    }
    auto channel = std::make_unique<Channel>();
    MONARCH_ASSIGN_OR_RETURN(channel->buffer, MappedRegion::Map(hello->fds[2].get(), true));
    channel->socket = std::move(hello->socket);
    channel->session = session;
    session->alive.store(true);
    return channel;
  }

  // A channel whose last request was answered, for the next one.
  void Return(ProcessState& state, std::unique_ptr<Channel> channel) const {
    MutexLock lock(&state.mu);
    if (channel->session == state.session.load() && state.idle.size() < kMaxIdleChannels) {
      state.idle.push_back(std::move(channel));
    }
  }

  // Sends a one-way notice on the notices' connection, made on first use.
  void SendNoticeLocked(ProcessState& state, MessageType type, const std::string& payload) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.consumed_mu) {
    if (!state.notice_socket.valid()) {
      // A second at most: a live service accepts at once, and a hit must
      // not wait on one that stopped accepting.
      absl::StatusOr<ScopedFd> socket = ConnectUnix(paths_.socket, /*timeout_seconds=*/1);
      if (!socket.ok()) return;  // No service: no prefetch to tell.
      // Non-blocking: a service that stopped reading (hung, stopped) must
      // not stall this process's hits, which never wait for it otherwise.
      const int flags = ::fcntl(socket->get(), F_GETFL);
      if (flags < 0 || ::fcntl(socket->get(), F_SETFL, flags | O_NONBLOCK) != 0) return;
      state.notice_socket = std::move(*socket);
    }
    // A service that went away, or a full socket (a frame may be cut short
    // there): connect again next time.
    if (!SendFrame(state.notice_socket.get(), type, payload).ok()) {
      state.notice_socket = ScopedFd();
    }
  }

 private:
  void MaybeRestartService(ProcessState& state, Clock::time_point now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
    if (!config_.node.autostart || now < state.next_autostart) return;
    // A service holds the lock: one starting, or a killed one not quite gone
    // (its sockets close before its flock is released). Look again at the
    // next reconnect, not after the back-off.
    if (ServiceLockHeld(paths_)) return;
    state.next_autostart = now + std::chrono::seconds(10);
    absl::StatusOr<std::string> file = AutostartConfigFile();
    absl::Status started = file.ok() ? StartServiceDetached(paths_, *file) : file.status();
    if (!started.ok()) MONARCH_LOG(kWarning, "cannot restart the service: ", started.message());
  }

  // The file an auto-started service reads its config from.
  absl::StatusOr<std::string> AutostartConfigFile() const {
    if (!source_.file.empty()) {
      char resolved[PATH_MAX];
      if (os::RealPath(source_.file.c_str(), resolved) == nullptr) {
        return ErrnoToStatus(errno, absl::StrCat("config file ", source_.file));
      }
      return std::string(resolved);
    }
    if (source_.yaml.empty()) {
      return absl::FailedPreconditionError(
          "node.autostart needs the config as YAML (a file or a string); a config built in code "
          "needs a service started with `monarch serve --config FILE`");
    }
    // Named by its content, so clients of one config share the file.
    const std::string file = JoinPath(
        paths_.dir, absl::StrCat("config-", absl::Hash<std::string>{}(source_.yaml) & 0xffffffff,
                                 ".yaml"));
    const std::string temp = absl::StrCat(file, ".", ::getpid());
    ScopedFd fd(os::Open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("write ", temp));
    MONARCH_RETURN_IF_ERROR(PwriteFull(fd.get(), source_.yaml.data(), source_.yaml.size(), 0, temp));
    if (os::Rename(temp.c_str(), file.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("rename ", temp));
    }
    return file;
  }

  const ClientProcess& process_;
  const Config& config_;
  const ConfigSource& source_;
  const ServicePaths& paths_;
};

// The client's administrative calls: requests that need no handshake and
// no session, each on a connection of its own.
class AdminCalls {
 public:
  // Both must outlive this.
  AdminCalls(const Config& config, const ServicePaths& paths) : config_(config), paths_(paths) {}

  // The node's counters, every client's hits included.
  absl::StatusOr<Stats> NodeStats() const {
    MONARCH_ASSIGN_OR_RETURN(Frame reply, Call(MessageType::kStats));
    MONARCH_ASSIGN_OR_RETURN(StatsReply stats, DecodeStatsReply(reply.payload));
    return std::move(stats.node);
  }
  // Returns once no promotion is in flight in the service.
  absl::Status WaitForPlacement() const { return Call(MessageType::kWaitForPlacement).status(); }

 private:
  // Its reply comes within node.request_timeout, but for WaitForPlacement's,
  // which comes once placement is idle: every promotion ends (its reads
  // do), and a stop cancels them; a service that dies closes the socket.
  absl::StatusOr<Frame> Call(MessageType type) const {
    MONARCH_ASSIGN_OR_RETURN(ScopedFd socket,
                             ConnectUnix(paths_.socket, config_.node.request_timeout_seconds));
    if (type == MessageType::kWaitForPlacement) MONARCH_RETURN_IF_ERROR(SetIoTimeout(socket.get(), 0));
    return service::Call(socket.get(), type, "");
  }

  const Config& config_;
  const ServicePaths& paths_;
};

// A client's side of the read path (core/read_path.h), in one session of
// the service: where files live is the service's namespace image and tier
// slots, mapped here; hits are read from the copies where the service put
// them, with no message, and counted in the page the service sums by tier
// index; everything else (a miss, a copy that fails to read, which the
// service's read path then judges and drops) is asked of the service.
class SessionFiles {
 public:
  using Handle = std::optional<FileRef>;

  // All must outlive this; `first_attempt`: false for a retry (the
  // service was replaced), which notes no first read.
  SessionFiles(const ChannelPool& channels, ProcessState& state, Session* session,
               bool first_attempt)
      : channels_(channels), state_(state), session_(session), first_attempt_(first_attempt) {}

  Handle Find(absl::string_view name) {
    const std::optional<uint32_t> id = session_->image->FindId(name);
    if (!id) return std::nullopt;
    return session_->image->ref(*id);
  }
  const FileRef& Ref(const Handle& file) const { return *file; }
  // The image holds the extents of the files the service caches by
  // extents, and their tier slots: their copies are read here as a file's.
  bool HasExtents(const Handle& file) const {
    // A guest reads whole files through the service, which proves them.
    return !session_->reply.guest && file->id < session_->image->file_count() &&
           session_->image->first_extent(file->id) != 0;
  }
  Handle ExtentAt(const Handle& file, uint64_t offset) const {
    const NamespaceImage& image = *session_->image;
    return image.ref(image.first_extent(file->id) +
                     static_cast<uint32_t>(offset / image.extent_bytes()));
  }
  // A reader read [offset, offset + n) of `file`, which the service caches
  // by extents. Its hits never reach the service, which would then see no
  // scan: this process finds its scans itself, by the service's rule
  // (placement/scan_rule.h), and once per extent a scan reaches,
  // if the extent a window ahead is not in a tier yet, tells the service,
  // which loads the extents ahead (not answered). Best effort, as a hint.
  void ReadingRange(const Handle& handle, uint64_t offset, size_t n) {
    const FileRef& file = *handle;
    const NamespaceImage& image = *session_->image;
    const uint64_t extent_bytes = image.extent_bytes();
    const uint32_t first = image.first_extent(file.id);
    if (n == 0 || extent_bytes == 0 || first == 0) return;
    const uint64_t end = offset + n;
    const uint64_t extent = (end - 1) / extent_bytes;
    const uint64_t last = (file.size - 1) / extent_bytes;
    {
      MutexLock lock(&state_.scans_mu);
      ProcessState::Scan& scan = state_.scans[file.id];
      const uint64_t last_end = scan.end;
      scan.end = end;
      if (!ContinuesScan(last_end, offset, end, extent_bytes, &scan.start)) return;
      if (scan.told_extent == extent || extent >= last) return;
      const uint64_t ahead = std::min(last, extent + kReadAheadExtents);
      const int tier = session_->slot(first + static_cast<uint32_t>(ahead)).load(
          std::memory_order_acquire);
      if (tier >= 0 && tier < session_->source_index) return;  // The window is there.
      scan.told_extent = extent;
    }
    MutexLock lock(&state_.consumed_mu);
    channels_.SendNoticeLocked(state_, MessageType::kReadAhead, Encode(ReadAheadNotice{file.id, end}));
  }
  // Tells the service, a batch at a time, which files this process
  // started reading: hits never reach it otherwise, and they free the
  // room the prefetch streams may fill ahead of the readers. Best effort:
  // with no service, there is no prefetch to tell.
  void FirstRead(const Handle& file) {
    if (!first_attempt_) return;
    MutexLock lock(&state_.consumed_mu);
    state_.consumed.push_back(file->id);
    const Clock::time_point now = Clock::now();
    if (state_.consumed.size() < kConsumedBatch && now - state_.consumed_sent < kConsumedDelay) {
      return;
    }
    state_.consumed_sent = now;
    ConsumedNotice notice;
    notice.file_ids.swap(state_.consumed);
    channels_.SendNoticeLocked(state_, MessageType::kConsumed, Encode(notice));
  }
  // The tier the file's slot names now. No pin: the service evicts under
  // a client's readers, which then read a RAM copy under its seqlock, a
  // file copy through a descriptor they hold: an eviction costs them a
  // miss, never a wrong byte.
  int BeginRead(const Handle& file) {
    const int tier = session_->slot(file->id).load(std::memory_order_acquire);
    return tier >= 0 && tier < session_->source_index ? tier : session_->source_index;
  }
  void EndRead(const Handle&) {}
  int source_tier() const { return session_->source_index; }
  StorageDriver* Reader(int tier) { return session_->readers[tier].get(); }
  absl::StatusOr<size_t> ReadCopy(StorageDriver& reader, const Handle& file, int tier,
                                  uint64_t offset, char* dst, size_t n) {
    TierReads& counted = state_.counters.load(std::memory_order_relaxed)->tiers[tier];
    if (state_.speeds != nullptr && state_.speeds->Routes(tier)) {
      return state_.speeds->ReadHit(session_->Source().capabilities().in_memory, reader, *file,
                                    tier, offset, dst, n, counted);
    }
    absl::StatusOr<size_t> got = reader.Read(*file, offset, dst, n);
    if (got.ok() && *got == n) counted.Count(n);
    return got;
  }
  std::optional<absl::StatusOr<size_t>> CopyFailed(const Handle&, int,
                                                   const absl::StatusOr<size_t>&, uint64_t,
                                                   char*, size_t) {
    return std::nullopt;  // The service's read path judges the copy.
  }
  // Asked of the service, in pieces of the channel's transfer buffer; of
  // the source itself while no service answers.
  std::optional<absl::StatusOr<size_t>> Miss(const Handle& file, uint64_t offset, char* dst,
                                             size_t n) {
    const FileRef& ref = *file;
    MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<Channel> channel, channels_.Take(state_, session_));
    if (session_->reply.guest && channel != nullptr) {
      MONARCH_RETURN_IF_ERROR(ProveAccess(channel, ref.id));
    }
    size_t done = 0;
    while (channel != nullptr && done < n) {
      const uint64_t piece = std::min<uint64_t>(n - done, session_->reply.buffer_bytes);
      ReadRequest request{ref.id, offset + done, piece};
      // A broken connection (or a reply that makes no sense) means the
      // service died or is stopping; an Error reply is the read's own
      // outcome (e.g. the source's EIO) and the connection stays usable.
      absl::StatusOr<Frame> reply = absl::InternalError("unsent");
      if (SendFrame(channel->socket.get(), MessageType::kRead, Encode(request)).ok()) {
        reply = ReceiveFrame(channel->socket.get());
      }
      if (reply.ok() && reply->type == MessageType::kError) {
        absl::StatusOr<ErrorReply> error = DecodeErrorReply(reply->payload);
        if (error.ok()) {
          channels_.Return(state_, std::move(channel));
          // A file the service's user may not read, but this guest may
          // (it proved so): read with this process's own credentials.
          if (session_->reply.guest && absl::IsPermissionDenied(error->ToStatus())) {
            break;
          }
          return error->ToStatus();
        }
      }
      absl::StatusOr<ReadReply> got =
          reply.ok() && reply->type == MessageType::kReadReply
              ? DecodeReadReply(reply->payload)
              : absl::StatusOr<ReadReply>(absl::UnavailableError("no reply"));
      if (!got.ok() || got->bytes > piece) {
        channel.reset();
        session_->alive.store(false);
        break;
      }
      CopyBytes(dst + done, channel->transfer(), got->bytes);
      done += got->bytes;
      if (got->bytes < piece) break;  // End of file (the source shrank).
    }
    if (channel != nullptr) {
      channels_.Return(state_, std::move(channel));
      return done;
    }
    // No service (or a guest's file the service may not read, or would not
    // take the proof of): the source itself, as an embedded instance
    // would, with this process's credentials. An extent's bytes are its
    // file's, at its place in it.
    const NamespaceImage& image = *session_->image;
    FileRef source_ref = ref;
    uint64_t source_offset = offset + done;
    if (ref.id >= image.file_count()) {
      const uint32_t file = image.file_of(ref.id);
      if (file >= image.file_count()) return absl::DataLossError("namespace image is damaged");
      source_ref = image.ref(file);
      source_offset += ref.part_offset;
    }
    MONARCH_ASSIGN_OR_RETURN(size_t rest,
                             session_->Source().Read(source_ref, source_offset, dst + done, n - done));
    state_.counters.load()->source_fallbacks.fetch_add(1, std::memory_order_relaxed);
    return done + rest;
  }

  // Proves access to `file` on a channel of its own (ProveAccess below).
  absl::Status ProveAccessTo(const FileRef& file) {
    if (session_->Proven(file.id)) return absl::OkStatus();
    MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<Channel> channel, channels_.Take(state_, session_));
    if (channel == nullptr) return absl::OkStatus();  // No service: reads go to the source.
    MONARCH_RETURN_IF_ERROR(ProveAccess(channel, file.id));
    if (channel != nullptr) channels_.Return(state_, std::move(channel));
    return absl::OkStatus();
  }

  // A guest proves, once per file and session, that it may read file `id`:
  // it opens the file on the source itself, which is the kernel's check
  // (and the caller's error when it refuses), and passes the descriptor.
  // When the service does not take the proof, `channel` is returned to the
  // pool (or dropped, if the connection broke) and left null: the caller
  // reads the source itself.
  absl::Status ProveAccess(std::unique_ptr<Channel>& channel, uint32_t id) {
    if (session_->Proven(id)) return absl::OkStatus();
    const std::string path =
        JoinPath(session_->reply.dataset_root, session_->image->file_name(id));
    ScopedFd fd(os::Open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      const int error = errno;
      channels_.Return(state_, std::move(channel));
      return ErrnoToStatus(error, absl::StrCat("open ", path));
    }
    absl::StatusOr<Frame> reply = absl::InternalError("unsent");
    if (SendFrame(channel->socket.get(), MessageType::kProveAccess,
                  Encode(ProveAccessRequest{id}), {fd.get()})
            .ok()) {
      reply = ReceiveFrame(channel->socket.get());
    }
    if (reply.ok() && reply->type == MessageType::kOk) {
      session_->MarkProven(id);
    } else if (reply.ok() && reply->type == MessageType::kError) {
      channels_.Return(state_, std::move(channel));
    } else {
      channel.reset();  // Out of step, or the service is gone.
      session_->alive.store(false);
    }
    return absl::OkStatus();
  }

  // The service's word: it checked the copies (this process has not).
  // Asked only of the pieces in a posix, pmem or RAM tier: no other is
  // mapped. For a RAM piece the service's yes means it holds the copy
  // for mappings once removed; the RAM reader maps it where it lies.
  std::vector<std::optional<SourceIdentity>> CheckedCopies(const std::vector<Handle>& pieces,
                                                           const std::vector<int>& tiers) {
    std::vector<Handle> asked;
    std::vector<size_t> where;  // Each asked piece's index in `pieces`.
    for (size_t i = 0; i < pieces.size(); ++i) {
      const auto kind = static_cast<TierKind>(session_->reply.tiers[tiers[i]].kind);
      if (kind == TierKind::kPosix || kind == TierKind::kPmem || kind == TierKind::kRam) {
        asked.push_back(pieces[i]);
        where.push_back(i);
      }
    }
    std::vector<std::optional<SourceIdentity>> checked(pieces.size());
    if (asked.empty()) return checked;
    std::vector<std::optional<SourceIdentity>> answers =
        AskCheckedCopies(asked);
    for (size_t j = 0; j < where.size(); ++j) checked[where[j]] = answers[j];
    return checked;
  }

 private:
  // kCheckedCopies for `pieces`, in as many messages as they take. None is
  // checked while no service answers (or it answers nonsense).
  std::vector<std::optional<SourceIdentity>> AskCheckedCopies(const std::vector<Handle>& pieces) {
    std::vector<std::optional<SourceIdentity>> checked(pieces.size());
    absl::StatusOr<std::unique_ptr<Channel>> channel = channels_.Take(state_, session_);
    if (!channel.ok() || *channel == nullptr) return checked;
    absl::flat_hash_map<uint32_t, size_t> index;  // Entry id -> its piece.
    for (size_t first = 0; first < pieces.size(); first += kMaxCheckedCopiesPerMessage) {
      CheckedCopiesRequest request;
      index.clear();
      const size_t last = std::min(pieces.size(), first + kMaxCheckedCopiesPerMessage);
      for (size_t i = first; i < last; ++i) {
        request.ids.push_back(pieces[i]->id);
        index[pieces[i]->id] = i;
      }
      absl::StatusOr<Frame> reply = absl::InternalError("unsent");
      if (SendFrame((*channel)->socket.get(), MessageType::kCheckedCopies, Encode(request)).ok()) {
        reply = ReceiveFrame((*channel)->socket.get());
      }
      absl::StatusOr<CheckedCopiesReply> got =
          reply.ok() && reply->type == MessageType::kCheckedCopiesReply
              ? DecodeCheckedCopiesReply(reply->payload)
              : absl::StatusOr<CheckedCopiesReply>(absl::UnavailableError("no reply"));
      if (!got.ok()) {
        // An error reply, or a service that died: the connection is not in step.
        channel->reset();
        return std::vector<std::optional<SourceIdentity>>(pieces.size());
      }
      for (const CheckedCopyStamp& c : got->copies) {
        auto it = index.find(c.id);
        if (it == index.end()) continue;  // Not asked: ignored.
        checked[it->second] = c.copy;
      }
    }
    channels_.Return(state_, std::move(*channel));
    return checked;
  }

  const ChannelPool& channels_;
  ProcessState& state_;
  Session* const session_;
  const bool first_attempt_;
};


class ServiceClient final : public Front {
 public:
  ServiceClient(Config config, ConfigSource source, ServicePaths paths)
      : config_(std::move(config)),
        source_(std::move(source)),
        paths_(std::move(paths)),
        process_(config_, paths_),
        channels_(process_, config_, source_, paths_),
        admin_(config_, paths_) {}

  absl::Status Start() {
    MONARCH_RETURN_IF_ERROR(PrepareRuntimeDirectory(paths_));
    MONARCH_ASSIGN_OR_RETURN(Hello hello, channels_.ConnectOrStart());
    if (const std::string shape = CacheShape(config_); hello.reply.cache_shape != shape) {
      MONARCH_LOG(kWarning, "the Monarch service at ", paths_.socket, " caches this dataset in ",
                  hello.reply.cache_shape, ", not in this config's ", shape,
                  ": its tiers are used. Both configs name this node.runtime_dir; leave it unset "
                  "to get a service of this config's own.");
    }
    return process_.Start(std::move(hello));
  }

  absl::StatusOr<size_t> Read(std::string_view name, void* buffer, size_t n,
                              uint64_t offset) override {
    ProcessState& state = process_.State();
    for (int attempt = 0;; ++attempt) {
      Session* session = process_.CurrentSession(state);
      if (session == nullptr) return absl::UnavailableError("no Monarch service session");
      SessionFiles files(channels_, state, session, /*first_attempt=*/attempt == 0);
      absl::StatusOr<size_t> result =
          ReadNamed(files, ToAbsl(name), static_cast<char*>(buffer), n, offset);
      // The service was replaced under us: ids may differ, look up again.
      // (ok() first: a hit must not pay for absl::IsAborted's out-of-line
      // calls, 46 instructions of a 1,100-instruction hit.)
      if (!result.ok() && absl::IsAborted(result.status()) && attempt < 3) continue;
      return result;
    }
  }

  absl::StatusOr<uint64_t> MapCopies(std::string_view name, void* mapping, uint64_t offset,
                                     uint64_t length, int protection, int flags) override {
    ProcessState& state = process_.State();
    Session* session = process_.CurrentSession(state);
    // Nobody to say which copies were checked, or a guest, which maps none.
    if (session == nullptr || session->reply.guest) return 0;
    SessionFiles files(channels_, state, session, /*first_attempt=*/false);
    const SessionFiles::Handle file = files.Find(ToAbsl(name));
    if (!file) return absl::NotFoundError(absl::StrCat("not a dataset file: ", ToAbsl(name)));
    return MapCopiesFound(files, file, static_cast<char*>(mapping), offset, length, protection,
                          flags);
  }

  // service::ProveAccess.
  absl::Status ProveAccessTo(std::string_view name) {
    ProcessState& state = process_.State();
    Session* session = process_.CurrentSession(state);
    if (session == nullptr || !session->reply.guest) return absl::OkStatus();
    SessionFiles files(channels_, state, session, /*first_attempt=*/false);
    const SessionFiles::Handle file = files.Find(ToAbsl(name));
    if (!file) return absl::NotFoundError(absl::StrCat("not a dataset file: ", ToAbsl(name)));
    return files.ProveAccessTo(*file);
  }

  const std::string& dataset_root() const override { return process_.root(); }

  // The node's counters (every client's included) from the service; this
  // process's own when no service answers.
  Stats NodeStats() const override {
    absl::StatusOr<Stats> node = admin_.NodeStats();
    if (node.ok()) return *std::move(node);
    Stats stats;
    CounterSink sink(&stats);
    const ClientCounters* counters = process_.State().counters.load();
    sink.Counter("service.client_source_fallbacks", counters->source_fallbacks.load(),
                 "Reads this process served from the source while no service answered.");
    return stats;
  }

  // Placement belongs to the service, which outlives its clients.
  void Shutdown(ShutdownMode) override {}

  void WaitForPlacement() override {
    absl::Status waited = admin_.WaitForPlacement();
    if (!waited.ok()) MONARCH_LOG(kInfo, "WaitForPlacement: ", waited.ToString());
  }

  const NamespaceView* View() const override {
    const Session* session = process_.CurrentSession(process_.State());
    return session != nullptr ? session->image.get() : nullptr;
  }

  // The order goes to the service in pieces on one connection; the service
  // merges it with the other processes' orders.
  absl::Status AnnounceIds(const NamespaceView& view, std::vector<uint32_t> ids,
                           std::vector<FileRange> ranges) override {
    ProcessState& state = process_.State();
    Session* session = process_.CurrentSession(state);
    if (session == nullptr || session->image.get() != &view) {
      return absl::AbortedError("session changed");
    }
    AnnounceRequest order;
    order.file_ids = std::move(ids);
    order.ranges = !ranges.empty();
    order.samples = std::move(ranges);
    return SendOrder(state, session, order);
  }

  const ReadSpeeds* Speeds() const override { return process_.State().speeds.get(); }

 private:
  // Sends `order` (its file ids, or its samples) in pieces on one connection.
  absl::Status SendOrder(ProcessState& state, Session* session, const AnnounceRequest& order) const {
    MONARCH_ASSIGN_OR_RETURN(std::unique_ptr<Channel> channel, channels_.Take(state, session));
    if (channel == nullptr) {
      return absl::UnavailableError(absl::StrCat("the Monarch service at ", paths_.socket,
                                                 " does not answer: no prefetch"));
    }
    const size_t total = order.ranges ? order.samples.size() : order.file_ids.size();
    const size_t max_piece = order.ranges ? kMaxRangesPerMessage : kMaxIdsPerMessage;
    size_t done = 0;
    do {
      const size_t piece = std::min(total - done, max_piece);
      AnnounceRequest request;
      request.first = done == 0;
      request.last = done + piece == total;
      request.ranges = order.ranges;
      if (order.ranges) {
        request.samples.assign(order.samples.begin() + done, order.samples.begin() + done + piece);
      } else {
        request.file_ids.assign(order.file_ids.begin() + done,
                                order.file_ids.begin() + done + piece);
      }
      // A refused order (a sample past its file's end) comes back as its
      // error.
      MONARCH_ASSIGN_OR_RETURN(Frame reply,
                               Call(channel->socket.get(), MessageType::kAnnounce, Encode(request)));
      if (reply.type != MessageType::kOk) {
        return absl::InternalError("the Monarch service did not accept the read order");
      }
      done += piece;
    } while (done < total);
    channels_.Return(state, std::move(channel));
    return absl::OkStatus();
  }

  const Config config_;
  const ConfigSource source_;
  const ServicePaths paths_;
  ClientProcess process_;
  ChannelPool channels_;
  AdminCalls admin_;
};

}  // namespace

bool IsServiceClient(const Monarch& monarch) {
  return dynamic_cast<const ServiceClient*>(&monarch) != nullptr;
}

absl::Status ProveAccess(Monarch& monarch, std::string_view name) {
  auto* client = dynamic_cast<ServiceClient*>(&monarch);
  return client != nullptr ? client->ProveAccessTo(name) : absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Monarch>> ConnectToNodeService(const ValidConfig& config,
                                                             const ConfigSource& source) {
  MONARCH_ASSIGN_OR_RETURN(ServicePaths paths, ServicePathsFor(*config));
  auto client = std::make_unique<ServiceClient>(*config, source, std::move(paths));
  MONARCH_RETURN_IF_ERROR(client->Start());
  return std::unique_ptr<Monarch>(std::move(client));
}

}  // namespace monarch::service
