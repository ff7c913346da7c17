// monarch: the node service and its administration.
//
//   monarch serve --config FILE        run the node's service in the foreground
//   monarch stop   [--config FILE | --runtime-dir DIR]
//   monarch status [--config FILE | --runtime-dir DIR]
//   monarch stats  [--json] [--watch [SECONDS]] [--config FILE | --runtime-dir DIR]
//   monarch stage  [--config FILE | --runtime-dir DIR] [GLOB...]
//   monarch manifest --config FILE [--output PATH]   walk the dataset once, write its manifest
//   monarch purge --config FILE [--dry-run]   remove the config's copies from its tiers (no service)
//   monarch config-reference [--update FILE]   the config keys' reference (config/README.md)
//   monarch epochs ...                 replay a training job's reads (see --help)
//
// Each command talks to the service of the config it is given (--config,
// else MONARCH_CONFIG): the one in its runtime directory, which by default
// is the one of the user's jobs reading that dataset through the same tiers
// (NodeRuntimeDirectory). A service found
// there that serves another dataset (two configs naming one
// node.runtime_dir) is refused, not stopped, staged into or reported on.
// --runtime-dir names a directory instead, whatever it serves.
//
// Exit codes: 0 success, 1 failure, 2 bad arguments, 3 no service running.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/shutdown.h"
#include "config/config_keys.h"
#include "config/valid_config.h"
#include "metadata/manifest.h"
#include "service/node_service.h"
#include "service/protocol.h"
#include "service/purge.h"
#include "service/ram_keeper.h"
#include "service/runtime.h"
#include "service/unix_socket.h"

int RunEpochs(int argc, char** argv);

namespace {

using monarch::service::Frame;
using monarch::service::MessageType;
using monarch::service::ServicePaths;

constexpr int kNoService = 3;

int Usage(const char* problem) {
  if (problem != nullptr) std::fprintf(stderr, "monarch: %s\n", problem);
  std::fprintf(stderr,
               "usage: monarch serve --config FILE\n"
               "       monarch stop   [--config FILE | --runtime-dir DIR]\n"
               "       monarch status [--config FILE | --runtime-dir DIR]\n"
               "       monarch stats  [--json] [--watch [SECONDS]] [--config FILE | --runtime-dir "
               "DIR]\n"
               "       monarch stage  [--config FILE | --runtime-dir DIR] [GLOB...]\n"
               "       monarch manifest --config FILE [--output PATH]\n"
               "       monarch purge  [--dry-run] --config FILE   remove the job's copies from "
               "every tier\n"
               "       monarch config-reference [--update config/README.md]\n"
               "       monarch epochs --help\n");
  return 2;
}

struct Args {
  std::string config;
  std::string runtime_dir;
  std::string output;  // manifest: where to write it.
  std::string update;  // config-reference: the file to update.
  bool json = false;
  double watch = 0;  // Seconds between refreshes; 0 = once.
  bool autostarted = false;
  bool dry_run = false;  // purge: list, remove nothing.
  std::vector<std::string> rest;
};

bool ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    if (flag == "--config") {
      if (!value(&args->config)) return false;
    } else if (flag == "--runtime-dir") {
      if (!value(&args->runtime_dir)) return false;
    } else if (flag == "--output") {
      if (!value(&args->output)) return false;
    } else if (flag == "--update") {
      if (!value(&args->update)) return false;
    } else if (flag == "--json") {
      args->json = true;
    } else if (flag == "--watch") {
      args->watch = 1;
      double seconds;
      if (i + 1 < argc && absl::SimpleAtod(argv[i + 1], &seconds) && seconds > 0) {
        args->watch = seconds;
        ++i;
      }
    } else if (flag == "--autostarted") {
      args->autostarted = true;
    } else if (flag == "--dry-run") {
      args->dry_run = true;
    } else if (flag.rfind("--", 0) == 0) {
      return false;
    } else {
      args->rest.push_back(flag);
    }
  }
  return true;
}

absl::StatusOr<monarch::ValidConfig> LoadConfig(const std::string& file) {
  return monarch::ParseValidConfigFile(file);
}

// The service a command is about: in --runtime-dir, or the one of the
// config (--config, else MONARCH_CONFIG), which must serve that config's
// dataset (`dataset_key`).
struct Target {
  ServicePaths paths;
  std::string config_file;  // Empty with --runtime-dir.
  std::string dataset;      // The config's dataset directory.
  std::string dataset_key;  // monarch::DatasetKey of the config's dataset.
};

absl::StatusOr<Target> FindService(const Args& args) {
  Target target;
  if (!args.runtime_dir.empty()) {
    target.paths = monarch::service::ServicePathsIn(args.runtime_dir);
    return target;
  }
  std::string file = args.config;
  if (file.empty() && std::getenv("MONARCH_CONFIG") != nullptr) file = std::getenv("MONARCH_CONFIG");
  if (file.empty()) {
    return absl::InvalidArgumentError(
        "which service? Give --config FILE (the service of that config) or --runtime-dir DIR");
  }
  absl::StatusOr<monarch::ValidConfig> config = LoadConfig(file);
  if (!config.ok()) return config.status();
  absl::StatusOr<ServicePaths> paths = monarch::service::ServicePathsFor(**config);
  if (!paths.ok()) return paths.status();
  target.paths = *std::move(paths);
  target.config_file = file;
  target.dataset = (*config)->dataset.path;
  target.dataset_key = monarch::DatasetKey((*config)->dataset);
  return target;
}

// A connection for an administrative command. A service answers those at
// once (a stage reports its progress several times a second), so a minute
// without a message means it is stopped or stuck: the command fails.
absl::StatusOr<monarch::ScopedFd> ConnectToService(const ServicePaths& paths) {
  return monarch::service::ConnectUnix(paths.socket, /*timeout_seconds=*/60);
}

absl::StatusOr<Frame> Ask(const ServicePaths& paths, MessageType type, const std::string& payload = "") {
  absl::StatusOr<monarch::ScopedFd> socket = ConnectToService(paths);
  if (!socket.ok()) return socket.status();
  return monarch::service::Call(socket->get(), type, payload);
}

int Failed(const absl::Status& status) {
  std::fprintf(stderr, "monarch: %s\n", std::string(status.message()).c_str());
  return absl::IsNotFound(status) || absl::IsUnavailable(status) ? kNoService : 1;
}

std::string Bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f %s", bytes, units[unit])
                   : absl::StrFormat("%.1f %s", bytes, units[unit]);
}

monarch::service::NodeService* serving = nullptr;
void OnSignal(int) {
  if (serving != nullptr) serving->RequestStop();
}

int Serve(const Args& args) {
  if (args.config.empty()) return Usage("serve needs --config FILE");
  absl::StatusOr<monarch::ValidConfig> config = LoadConfig(args.config);
  if (!config.ok()) return Failed(config.status());
  absl::StatusOr<std::unique_ptr<monarch::service::NodeService>> service =
      monarch::service::NodeService::Start(*config);
  if (!service.ok()) {
    // Two clients starting a service at once: the second one is not needed.
    if (args.autostarted && absl::IsFailedPrecondition(service.status()) &&
        std::string(service.status().message()).find("already running") != std::string::npos) {
      return 0;
    }
    return Failed(service.status());
  }
  serving = service->get();
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::fprintf(stderr, "monarch: serving %s at %s (pid %d)%s\n", (*config)->dataset.path.c_str(),
               (*service)->paths().socket.c_str(), static_cast<int>(::getpid()),
               (*service)->metrics_port() > 0
                   ? absl::StrCat(", metrics at http://127.0.0.1:", (*service)->metrics_port(),
                                  "/metrics")
                         .c_str()
                   : "");
  (*service)->Wait();
  serving = nullptr;
  // A thread left in a read that never returned keeps what it uses: the
  // process exits without joining it.
  if (!(*service)->stopped_cleanly()) monarch::Abandon(std::move(*service));
  service->reset();
  return 0;
}

// The target's status, once it is known to serve the config's dataset:
// FailedPrecondition (saying it refuses to `verb` it) when it serves another.
absl::StatusOr<monarch::service::StatusReply> StatusOfTarget(const Target& target,
                                                             const char* verb) {
  absl::StatusOr<Frame> reply = Ask(target.paths, MessageType::kStatus);
  if (!reply.ok()) return reply.status();
  absl::StatusOr<monarch::service::StatusReply> status =
      monarch::service::DecodeStatusReply(reply->payload);
  if (!status.ok()) return status.status();
  if (!target.dataset_key.empty() && status->dataset_key != target.dataset_key) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the Monarch service at ", target.paths.socket, " serves dataset '",
        status->dataset_root, "', not '", target.dataset, "' (", target.config_file,
        "'s): refusing to ", verb,
        " it. Both configs name this node.runtime_dir: leave it unset (one service per dataset "
        "and cache shape) or give each config its own"));
  }
  return status;
}

int Stop(const Args& args) {
  absl::StatusOr<Target> target = FindService(args);
  if (!target.ok()) return Failed(target.status());
  const ServicePaths* paths = &target->paths;
  if (absl::StatusOr<monarch::service::StatusReply> status = StatusOfTarget(*target, "stop");
      !status.ok()) {
    return Failed(status.status());
  }
  absl::StatusOr<Frame> reply = Ask(*paths, MessageType::kStop);
  if (!reply.ok()) return Failed(reply.status());
  // Stopped when the lock is free (the service holds it to its last moment).
  // A service's stop is bounded (NodeService::Wait): well within a minute.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (monarch::service::ServiceLockHeld(*paths)) {
    if (std::chrono::steady_clock::now() > give_up) {
      return Failed(absl::DeadlineExceededError(absl::StrCat(
          "the Monarch service at ", paths->socket,
          " was asked to stop and still holds its lock after 60 s; see ", paths->log)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("stopped the Monarch service at %s\n", paths->socket.c_str());
  return 0;
}

// Each job: its processes, what it read, its hit rate and the source bytes
// its misses waited for, as a share of the node's.
void PrintJobs(const std::vector<monarch::service::JobStats>& jobs, uint64_t source_bytes) {
  size_t attached = 0;
  for (const auto& job : jobs) attached += job.processes > 0 ? 1 : 0;
  std::printf("  jobs      %zu attached, %zu left\n", attached, jobs.size() - attached);
  for (const auto& job : jobs) {
    const uint64_t read = job.hit_bytes + job.miss_bytes;
    std::printf("    %-24s %-13s read %s, %.1f%% hits, waited on the source for %s (%.1f%%)\n",
                job.name.c_str(),
                job.processes == 0   ? "left"
                : job.processes == 1 ? "1 process"
                                     : absl::StrCat(job.processes, " processes").c_str(),
                Bytes(static_cast<double>(read)).c_str(),
                read == 0 ? 0.0 : 100.0 * job.hit_bytes / read,
                Bytes(static_cast<double>(job.source_bytes)).c_str(),
                source_bytes == 0 ? 0.0 : 100.0 * job.source_bytes / source_bytes);
  }
}

int Status(const Args& args) {
  absl::StatusOr<Target> target = FindService(args);
  if (!target.ok()) return Failed(target.status());
  const ServicePaths* paths = &target->paths;
  absl::StatusOr<monarch::service::StatusReply> status = StatusOfTarget(*target, "report on");
  if (absl::IsNotFound(status.status()) || absl::IsUnavailable(status.status())) {
    if (monarch::service::ServiceLockHeld(*paths)) {
      std::printf("a Monarch service is starting at %s\n", paths->socket.c_str());
      return 0;
    }
    std::printf("no Monarch service at %s\n", paths->socket.c_str());
    return kNoService;
  }
  if (!status.ok()) return Failed(status.status());
  std::printf(
      "Monarch service pid %u at %s\n  dataset   %s\n  uptime    %.0f s\n  clients   %u\n"
      "  files     %llu (%s)\n  in tiers  %llu files (%s, %.1f%%)\n",
      status->service_pid, paths->socket.c_str(), status->dataset_root.c_str(),
      status->uptime_seconds, status->clients, static_cast<unsigned long long>(status->files),
      Bytes(static_cast<double>(status->dataset_bytes)).c_str(),
      static_cast<unsigned long long>(status->files_in_tiers),
      Bytes(static_cast<double>(status->bytes_in_tiers)).c_str(),
      status->dataset_bytes == 0 ? 100.0 : 100.0 * status->bytes_in_tiers / status->dataset_bytes);
  std::printf("  tiers     %s\n  source    %s read\n", status->cache_shape.c_str(),
              Bytes(static_cast<double>(status->source_bytes)).c_str());
  PrintJobs(status->jobs, status->source_bytes);
  return 0;
}

void PrintStats(const monarch::service::StatsReply& stats, bool json) {
  if (json) {
    std::string clients;
    for (const auto& c : stats.clients) {
      absl::StrAppend(&clients, clients.empty() ? "" : ", ", "{\"pid\": ", c.pid,
                      ", \"connections\": ", c.connections, ", \"hits\": ", c.hits,
                      ", \"hit_bytes\": ", c.hit_bytes, ", \"misses\": ", c.misses,
                      ", \"miss_bytes\": ", c.miss_bytes, "}");
    }
    std::string jobs;
    for (const auto& j : stats.jobs) {  // Names are SafeJobName()s: nothing to escape.
      absl::StrAppend(&jobs, jobs.empty() ? "" : ", ", "{\"name\": \"", j.name,
                      "\", \"processes\": ", j.processes, ", \"hits\": ", j.hits,
                      ", \"hit_bytes\": ", j.hit_bytes, ", \"misses\": ", j.misses,
                      ", \"miss_bytes\": ", j.miss_bytes, ", \"source_bytes\": ", j.source_bytes,
                      "}");
    }
    std::printf("{\"node\": %s, \"clients\": [%s], \"jobs\": [%s]}\n",
                stats.node.ToJson().c_str(), clients.c_str(), jobs.c_str());
    return;
  }
  std::printf("%-12s %-7s %12s %12s %10s %12s %12s %8s\n", "tier", "kind", "reads", "read",
              "files", "used", "capacity", "errors");
  const std::vector<std::string> tiers = stats.node.TierNames();
  for (size_t t = 0; t < tiers.size(); ++t) {
    std::string kind;
    for (const monarch::Metric& m : stats.node.metrics) {
      if (m.tier == tiers[t]) kind = m.tier_kind;
    }
    std::printf("%-12s %-7s %12llu %12s %10llu %12s %12s %8llu\n", tiers[t].c_str(), kind.c_str(),
                static_cast<unsigned long long>(stats.node.Tier(t, "reads")),
                Bytes(static_cast<double>(stats.node.Tier(t, "bytes_read"))).c_str(),
                static_cast<unsigned long long>(stats.node.Tier(t, "files")),
                Bytes(static_cast<double>(stats.node.Tier(t, "bytes_used"))).c_str(),
                Bytes(static_cast<double>(stats.node.Tier(t, "capacity"))).c_str(),
                static_cast<unsigned long long>(stats.node.Tier(t, "read_errors") +
                                                stats.node.Tier(t, "write_errors")));
  }
  std::printf("promotions: %llu started, %llu completed, %llu failed; staging %s\n",
              static_cast<unsigned long long>(stats.node.Get("promotions_started")),
              static_cast<unsigned long long>(stats.node.Get("promotions_completed")),
              static_cast<unsigned long long>(stats.node.Get("promotions_failed")),
              Bytes(static_cast<double>(stats.node.Get("staging_bytes"))).c_str());
  std::printf("%-8s %6s %12s %12s %12s %12s\n", "client", "conns", "hits", "hit bytes",
              "misses", "miss bytes");
  for (const auto& c : stats.clients) {
    std::printf("%-8u %6u %12llu %12s %12llu %12s\n", c.pid, c.connections,
                static_cast<unsigned long long>(c.hits),
                Bytes(static_cast<double>(c.hit_bytes)).c_str(),
                static_cast<unsigned long long>(c.misses),
                Bytes(static_cast<double>(c.miss_bytes)).c_str());
  }
}

int StatsCommand(const Args& args) {
  absl::StatusOr<Target> target = FindService(args);
  if (!target.ok()) return Failed(target.status());
  if (absl::StatusOr<monarch::service::StatusReply> status = StatusOfTarget(*target, "report on");
      !status.ok()) {
    return Failed(status.status());
  }
  const ServicePaths* paths = &target->paths;
  for (;;) {
    absl::StatusOr<Frame> reply = Ask(*paths, MessageType::kStats);
    if (!reply.ok()) return Failed(reply.status());
    absl::StatusOr<monarch::service::StatsReply> stats =
        monarch::service::DecodeStatsReply(reply->payload);
    if (!stats.ok()) return Failed(stats.status());
    if (args.watch > 0 && !args.json && isatty(1)) std::printf("\033[H\033[2J");
    PrintStats(*stats, args.json);
    std::fflush(stdout);
    if (args.watch <= 0) return 0;
    std::this_thread::sleep_for(std::chrono::duration<double>(args.watch));
  }
}

int Stage(const Args& args) {
  absl::StatusOr<Target> target = FindService(args);
  if (!target.ok()) return Failed(target.status());
  if (absl::StatusOr<monarch::service::StatusReply> status = StatusOfTarget(*target, "stage into");
      !status.ok()) {
    return Failed(status.status());
  }
  const ServicePaths* paths = &target->paths;
  absl::StatusOr<monarch::ScopedFd> socket = ConnectToService(*paths);
  if (!socket.ok()) return Failed(socket.status());
  monarch::service::StageRequest request;
  request.globs = args.rest;
  absl::Status sent = monarch::service::SendFrame(socket->get(), MessageType::kStage,
                                                  monarch::service::Encode(request));
  if (!sent.ok()) return Failed(sent);
  const auto began = std::chrono::steady_clock::now();
  const bool tty = isatty(2);
  monarch::service::StageProgress last;
  for (;;) {
    absl::StatusOr<Frame> frame = monarch::service::ReceiveFrame(socket->get());
    if (!frame.ok()) return Failed(frame.status());
    if (frame->type == MessageType::kError) {
      absl::StatusOr<monarch::service::ErrorReply> error =
          monarch::service::DecodeErrorReply(frame->payload);
      return Failed(error.ok() ? error->ToStatus() : error.status());
    }
    absl::StatusOr<monarch::service::StageProgress> progress =
        monarch::service::DecodeStageProgress(frame->payload);
    if (!progress.ok()) return Failed(progress.status());
    last = *progress;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    const double rate = seconds > 0 ? last.bytes_done / seconds : 0;
    const double fraction = last.bytes_total == 0 ? 1.0 : double(last.bytes_done) / last.bytes_total;
    const double eta = rate > 0 ? (last.bytes_total - last.bytes_done) / rate : 0;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
    std::fprintf(stderr, "%s[%s] %3.0f%%  %llu/%llu files  %s/%s  %s/s  ETA %.0f s%s",
                 tty ? "\r" : "", bar.c_str(), 100 * fraction,
                 static_cast<unsigned long long>(last.files_done),
                 static_cast<unsigned long long>(last.files_total),
                 Bytes(static_cast<double>(last.bytes_done)).c_str(),
                 Bytes(static_cast<double>(last.bytes_total)).c_str(), Bytes(rate).c_str(), eta,
                 tty ? "" : "\n");
    if (last.finished) break;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::fprintf(stderr, "%s", tty ? "\n" : "");
  std::printf("staged %llu of %llu files (%s of %s) in %.1f s; %llu did not fit in any tier\n",
              static_cast<unsigned long long>(last.files_in_tiers),
              static_cast<unsigned long long>(last.files_total),
              Bytes(static_cast<double>(last.bytes_done)).c_str(),
              Bytes(static_cast<double>(last.bytes_total)).c_str(), seconds,
              static_cast<unsigned long long>(last.files_done - last.files_in_tiers));
  return 0;
}

// Walks the config's dataset once and writes its manifest: to --output, or
// where the config's dataset.manifest says. Needs no service.
int ManifestCommand(const Args& args) {
  if (args.config.empty()) return Usage("manifest needs --config FILE");
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "monarch: %s\n", std::string(status.message()).c_str());
    return 1;
  };
  absl::StatusOr<monarch::ValidConfig> config = LoadConfig(args.config);
  if (!config.ok()) return fail(config.status());
  std::string output = args.output;
  if (output.empty()) {
    if ((*config)->dataset.manifest.empty()) {
      return Usage("manifest needs --output PATH, or dataset.manifest in the config");
    }
    absl::StatusOr<std::string> path = monarch::DatasetManifestPath((*config)->dataset);
    if (!path.ok()) return fail(path.status());
    output = *path;
  }
  const monarch::ManifestOrigin origin = monarch::ManifestOriginOf((*config)->dataset);
  const auto began = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<monarch::Namespace>> ns =
      monarch::Namespace::Build(origin.root, origin.file_regex, 0, (*config)->dataset.scan_threads,
                                {}, origin.symlinks);
  if (!ns.ok()) return fail(ns.status());
  const double walked =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  absl::Status written = monarch::WriteManifest(**ns, origin, output);
  if (!written.ok()) return fail(written);
  std::printf("wrote %s: %u files, %s (%llu bytes) in %u directories; walked %s in %.2f s\n",
              output.c_str(), (*ns)->file_count(),
              Bytes(static_cast<double>((*ns)->total_bytes())).c_str(),
              static_cast<unsigned long long>((*ns)->total_bytes()), (*ns)->directory_count(),
              origin.root.c_str(), walked);
  return 0;
}

// Removes the copies of the config's job from every tier of it, at the end
// of a job (service/purge.h): never while its service runs, never a file
// Monarch did not write, never the dataset. Prints per tier what went.
int PurgeCommand(const Args& args) {
  std::string file = args.config;
  if (file.empty() && std::getenv("MONARCH_CONFIG") != nullptr) file = std::getenv("MONARCH_CONFIG");
  if (file.empty()) return Usage("purge needs --config FILE (or MONARCH_CONFIG)");
  if (!args.runtime_dir.empty()) {
    return Usage("purge takes --config FILE, not --runtime-dir: the tiers are the config's");
  }
  if (!args.rest.empty()) return Usage(absl::StrCat("purge: unexpected '", args.rest[0], "'").c_str());
  monarch::PurgeOptions options;
  options.dry_run = args.dry_run;
  if (args.dry_run) {
    options.on_file = [](const std::string& path, uint64_t bytes) {
      std::printf("  would remove %s (%llu bytes)\n", path.c_str(),
                  static_cast<unsigned long long>(bytes));
    };
  }
  absl::StatusOr<monarch::service::ConfigPurge> purge =
      monarch::service::PurgeConfigFile(file, options);
  if (!purge.ok()) {
    std::fprintf(stderr, "monarch: %s\n", std::string(purge.status().message()).c_str());
    return 1;
  }
  const char* verb = args.dry_run ? "would remove" : "removed";
  uint64_t files = 0, bytes = 0;
  for (const monarch::service::TierPurge& tier : purge->tiers) {
    const std::string label =
        absl::StrCat("tier '", tier.name, "' (", monarch::TierKindName(tier.kind), ")");
    if (!tier.status.ok()) {
      std::fprintf(stderr, "monarch: %s\n", std::string(tier.status.message()).c_str());
      continue;
    }
    switch (tier.kind) {
      case monarch::TierKind::kSource:
        std::printf("%s: the dataset, %s: never touched\n", label.c_str(), purge->dataset.c_str());
        break;
      case monarch::TierKind::kPeers:
        break;
      case monarch::TierKind::kRam: {
        std::string holders;
        for (pid_t pid : tier.holders) absl::StrAppend(&holders, holders.empty() ? "" : " ", pid);
        const std::string kept =
            tier.kept_bytes > 0
                ? absl::StrCat(verb, " the copies a stopped service kept in ", tier.kept_path,
                               " (", tier.kept_bytes, " bytes of memory)")
                : absl::StrCat("no copies kept by a stopped service in ", tier.kept_path);
        std::printf("%s: %s%s%s\n", label.c_str(), kept.c_str(),
                    tier.holders.empty()
                        ? "; no process maps this tier now"
                        : "; processes of this user map a RAM tier of this name now, and hold "
                          "what they map until they exit (this job's clients, or another "
                          "job's tier): pid ",
                    holders.c_str());
        break;
      }
      case monarch::TierKind::kPosix:
      case monarch::TierKind::kPmem: {
        const monarch::PurgeReport& r = tier.report;
        files += r.copies + r.temporaries;
        bytes += r.copy_bytes + r.temporary_bytes;
        std::printf("%s %s: %s %llu copies (%s, %llu bytes), %llu temporaries (%llu bytes), "
                    "%llu directories; kept %llu files Monarch did not write, %llu symlinks "
                    "(not followed)%s\n",
                    label.c_str(), tier.path.c_str(), verb,
                    static_cast<unsigned long long>(r.copies),
                    Bytes(static_cast<double>(r.copy_bytes)).c_str(),
                    static_cast<unsigned long long>(r.copy_bytes),
                    static_cast<unsigned long long>(r.temporaries),
                    static_cast<unsigned long long>(r.temporary_bytes),
                    static_cast<unsigned long long>(r.directories),
                    static_cast<unsigned long long>(r.foreign_files),
                    static_cast<unsigned long long>(r.symlinks),
                    absl::StrCat(r.mount_points > 0
                                     ? absl::StrCat(", ", r.mount_points,
                                                    " mount points (not entered)")
                                     : "",
                                 r.live_temporaries > 0
                                     ? absl::StrCat(", ", r.live_temporaries,
                                                    " temporaries of a running writer")
                                     : "")
                        .c_str());
        for (const std::string& error : r.errors) {
          std::fprintf(stderr, "monarch: %s: %s\n", label.c_str(), error.c_str());
        }
        break;
      }
    }
  }
  if (purge->removed_socket) {
    std::printf("runtime directory %s: %s the dead service's socket\n", purge->paths.dir.c_str(),
                verb);
  }
  const absl::Status overall = purge->Overall();
  std::printf("%s %s: %llu files, %s (%llu bytes)%s\n", args.dry_run ? "dry run of" : "purged",
              file.c_str(), static_cast<unsigned long long>(files),
              Bytes(static_cast<double>(bytes)).c_str(), static_cast<unsigned long long>(bytes),
              overall.ok() ? "" : "; some tiers failed (above)");
  return overall.ok() ? 0 : 1;
}

// Prints the reference of every config key, made from the table that also
// drives the parser; --update FILE writes it between the markers in FILE.
int ConfigReferenceCommand(const Args& args) {
  const std::string reference = monarch::config_keys::ConfigReference();
  if (args.output.empty() && args.update.empty()) {
    std::printf("%s", reference.c_str());
    return 0;
  }
  const std::string& file = args.update;
  absl::StatusOr<std::string> text = monarch::ReadSmallFile(file, 16 << 20);
  if (!text.ok()) return Failed(text.status());
  absl::StatusOr<std::string> updated =
      monarch::config_keys::WithReference(*text, reference);
  if (!updated.ok()) return Failed(updated.status());
  std::FILE* out = std::fopen(file.c_str(), "w");
  if (out == nullptr || std::fwrite(updated->data(), 1, updated->size(), out) != updated->size() ||
      std::fclose(out) != 0) {
    std::fprintf(stderr, "monarch: cannot write %s\n", file.c_str());
    return 1;
  }
  std::printf("updated the config reference in %s\n", file.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Never under the transparent mode (LD_PRELOAD=libmonarch_preload.so,
  // inherited from a job's environment): start again without it.
  if (const char* preload = std::getenv("LD_PRELOAD");
      preload != nullptr && std::strstr(preload, "libmonarch_preload") != nullptr) {
    const std::string kept = monarch::service::WithoutPreloadLibrary(preload);
    if (kept.empty()) {
      ::unsetenv("LD_PRELOAD");
    } else {
      ::setenv("LD_PRELOAD", kept.c_str(), 1);
    }
    ::execv("/proc/self/exe", argv);
    std::perror("monarch: restarting without LD_PRELOAD");
    return 1;
  }
  if (argc < 2) return Usage(nullptr);
  const std::string command = argv[1];
  if (command == "epochs") return RunEpochs(argc - 1, argv + 1);
  if (command == "--help" || command == "-h" || command == "help") {
    Usage(nullptr);
    return 0;
  }
  Args args;
  if (!ParseArgs(argc, argv, &args)) return Usage("bad arguments");
  if (command == "serve") return Serve(args);
  if (command == "stop") return Stop(args);
  if (command == "status") return Status(args);
  if (command == "stats") return StatsCommand(args);
  if (command == "stage") return Stage(args);
  if (command == "manifest") return ManifestCommand(args);
  if (command == "purge") return PurgeCommand(args);
  if (command == "config-reference") return ConfigReferenceCommand(args);
  // Started by a node service, not by users (service/ram_keeper.h).
  if (command == "ram-keeper") {
    if (args.runtime_dir.empty()) return Usage("ram-keeper needs --runtime-dir DIR");
    return monarch::service::RunRamKeeper(args.runtime_dir, 1);
  }
  return Usage(absl::StrCat("unknown command '", command, "'").c_str());
}
