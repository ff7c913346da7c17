// ClientRequests and Stage: a node service's answers to one client.

#include "service/client_requests.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "frontend/dataset_paths.h"
#include "frontend/glob.h"

namespace monarch::service {
namespace {

// Checks file ids from a client: an id past the namespace is a hostile or
// broken message, refused like a malformed one.
absl::Status CheckFileIds(const std::vector<uint32_t>& ids, uint32_t count,
                          absl::string_view what) {
  for (uint32_t id : ids) {
    if (id >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": id ", id, " out of range (", count, " in the namespace)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SendError(int socket, const absl::Status& status) {
  return SendFrame(socket, MessageType::kError, Encode(ErrorReply::From(status)));
}

absl::Status ClientRequests::Handle(int socket, char* transfer, pid_t pid, const Frame& frame,
                                    absl::FunctionRef<void()> mark_announced) {
  const bool hint = frame.type == MessageType::kConsumed || frame.type == MessageType::kReadAhead;
  if (transfer == nullptr && !hint) return absl::InvalidArgumentError("request before hello");
  switch (frame.type) {
    case MessageType::kRead: return Read(socket, transfer, pid, frame);
    case MessageType::kAnnounce: return Announce(socket, pid, frame, mark_announced);
    case MessageType::kConsumed: return Consumed(pid, frame);
    case MessageType::kReadAhead: return ReadAhead(frame);
    case MessageType::kProveAccess: return ProveAccess(socket, pid, frame);
    default:
      // A guest maps no copy: it would read bytes nobody checked it may.
      if (guest_ != nullptr) {
        return SendError(socket, absl::PermissionDeniedError(
                                     "a guest of the service maps no copies"));
      }
      return CheckedCopies(socket, frame);
  }
}

absl::Status ClientRequests::Read(int socket, char* transfer, pid_t pid, const Frame& frame) {
  absl::StatusOr<ReadRequest> request = DecodeReadRequest(frame.payload);
  if (!request.ok()) return request.status();  // Answered and closed by Serve().
  if (guest_ != nullptr && !guest_->Granted(pid, request->file_id)) {
    return SendError(socket, absl::PermissionDeniedError(absl::StrCat(
                                 "entry ", request->file_id,
                                 ": this process has not proved it may read the file "
                                 "(node.share_with_group)")));
  }
  if (request->length > buffer_bytes_) {
    return SendError(socket,
                     absl::InvalidArgumentError(absl::StrCat(
                         "read of ", request->length, " bytes is larger than the transfer buffer (",
                         buffer_bytes_, ")")));
  }
  // A file's id, or an extent's (a client reads a file cached by extents
  // extent by extent, as the service would). The source reads it makes
  // are this client's to pay (`monarch status`).
  absl::StatusOr<size_t> n = [&] {
    ChargeSourceReads charged(&source_bytes);
    return core_.ReadFile(request->file_id, transfer, static_cast<size_t>(request->length),
                          request->offset);
  }();
  if (!n.ok()) return SendError(socket, n.status());
  misses.fetch_add(1, std::memory_order_relaxed);
  miss_bytes.fetch_add(*n, std::memory_order_relaxed);
  absl::Status sent = SendFrame(socket, MessageType::kReadReply, Encode(ReadReply{*n}));
  // After the miss was answered (and its promotion started): a miss of
  // a job that announces nothing may stage the directory it is in.
  core_.StageAheadOnMiss(request->file_id);
  return sent;
}

absl::Status ClientRequests::ProveAccess(int socket, pid_t pid, const Frame& frame) {
  absl::StatusOr<ProveAccessRequest> request = DecodeProveAccessRequest(frame.payload);
  if (!request.ok()) return request.status();  // Answered and closed by Serve().
  if (guest_ != nullptr) {
    if (frame.fds.size() != 1) {
      return absl::InvalidArgumentError("prove access: expected one descriptor");
    }
    absl::Status proved = guest_->Prove(pid, request->file_id, frame.fds[0].get());
    if (absl::IsInvalidArgument(proved)) return proved;
    if (!proved.ok()) {
      MONARCH_LOG(kWarning, "monarch service: guest pid ", pid, ": ", proved.message());
      return SendError(socket, proved);
    }
  }
  return SendFrame(socket, MessageType::kOk, "");
}

absl::Status ClientRequests::Announce(int socket, pid_t pid, const Frame& frame,
                                      absl::FunctionRef<void()> mark) {
  absl::StatusOr<AnnounceRequest> request = DecodeAnnounceRequest(frame.payload);
  if (!request.ok()) return request.status();  // Answered and closed by Serve().
  const uint32_t files = core_.name_space().file_count();
  if (request->first) {
    pending_order_.clear();
    pending_ranges_.clear();
    pending_is_ranges_ = request->ranges;
  } else if (request->ranges != pending_is_ranges_) {
    return absl::InvalidArgumentError("announce: a piece of ranges in an order of files, or the "
                                      "other way round");
  }
  // An order covers some epochs, not an unbounded stream of pieces.
  const uint64_t limit =
      std::max<uint64_t>(uint64_t{files} * kMaxAnnouncedEpochs, kMaxIdsPerMessage);
  const uint64_t pending = pending_order_.size() + pending_ranges_.size();
  if (!request->ranges) {
    MONARCH_RETURN_IF_ERROR(CheckFileIds(request->file_ids, files, "announce"));
    if (pending + request->file_ids.size() > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "announce: an order of more than ", limit, " files (", kMaxAnnouncedEpochs,
          " epochs of the dataset)"));
    }
    pending_order_.insert(pending_order_.end(), request->file_ids.begin(),
                            request->file_ids.end());
  } else {
    // Samples are bounded like files, by epochs of the dataset: an epoch
    // has at most a sample per file, or per 4 KiB of a big file's records.
    const uint64_t per_epoch =
        std::max<uint64_t>(files, core_.name_space().total_bytes() / 4096);
    const uint64_t range_limit =
        std::max<uint64_t>(per_epoch * kMaxAnnouncedEpochs, kMaxRangesPerMessage);
    if (pending + request->samples.size() > range_limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("announce: an order of more than ", range_limit, " samples"));
    }
    for (const FileRange& sample : request->samples) {
      if (sample.file_id >= files) {
        return absl::InvalidArgumentError(absl::StrCat("announce: file id ", sample.file_id,
                                                       " out of range (", files, " files)"));
      }
      pending_ranges_.push_back(sample);
    }
  }
  if (request->last) {
    mark();
    if (pending_is_ranges_) {
      // A sample past its file's end is the client's mistake, not a
      // hostile message: answered, and the connection stays.
      absl::Status announced = core_.AnnounceRangesOf(pid, pending_ranges_, prefetched);
      pending_ranges_ = {};
      if (!announced.ok()) return SendError(socket, announced);
    } else {
      core_.AnnounceOrderOf(pid, std::move(pending_order_), prefetched);
      pending_order_ = {};
    }
  }
  return SendFrame(socket, MessageType::kOk, "");
}

absl::Status ClientRequests::Consumed(pid_t pid, const Frame& frame) {
  absl::StatusOr<ConsumedNotice> notice = DecodeConsumedNotice(frame.payload);
  if (!notice.ok()) return notice.status();
  // Extents too: a client's first reads of the extents of an order of ranges.
  MONARCH_RETURN_IF_ERROR(
      CheckFileIds(notice->file_ids, core_.name_space().entry_count(), "consumed"));
  core_.ConsumedBy(pid, notice->file_ids.data(), notice->file_ids.size());
  return absl::OkStatus();  // Not answered: the client does not wait for it.
}

absl::Status ClientRequests::ReadAhead(const Frame& frame) {
  absl::StatusOr<ReadAheadNotice> notice = DecodeReadAheadNotice(frame.payload);
  if (!notice.ok()) return notice.status();
  MONARCH_RETURN_IF_ERROR(
      CheckFileIds({notice->file_id}, core_.name_space().file_count(), "read-ahead"));
  core_.ReadAheadOf(notice->file_id, notice->end);
  return absl::OkStatus();
}

absl::Status ClientRequests::CheckedCopies(int socket, const Frame& frame) {
  absl::StatusOr<CheckedCopiesRequest> request = DecodeCheckedCopiesRequest(frame.payload);
  if (!request.ok()) return request.status();
  MONARCH_RETURN_IF_ERROR(
      CheckFileIds(request->ids, core_.name_space().entry_count(), "checked copies"));
  const std::vector<std::optional<SourceIdentity>> checked = core_.CheckedCopiesOf(request->ids);
  CheckedCopiesReply reply;
  for (size_t i = 0; i < request->ids.size(); ++i) {
    if (checked[i]) reply.copies.push_back(CheckedCopyStamp{request->ids[i], *checked[i]});
  }
  return SendFrame(socket, MessageType::kCheckedCopiesReply, Encode(reply));
}

absl::Status Stage(MonarchCore& core, const std::atomic<bool>& stopping, int socket,
                   const Frame& frame) {
  absl::StatusOr<StageRequest> request = DecodeStageRequest(frame.payload);
  if (!request.ok()) return request.status();  // Answered and closed by Serve().
  const Namespace& ns = core.name_space();
  const int source = core.tier_count() - 1;
  // The files to stage, in namespace order, each once.
  std::vector<uint32_t> ids;
  if (request->globs.empty()) {
    for (uint32_t id = 0; id < ns.file_count(); ++id) ids.push_back(id);
  } else {
    const frontend::DatasetPaths paths(core.dataset_root());
    std::vector<bool> chosen(ns.file_count(), false);
    for (const std::string& glob : request->globs) {
      const std::string pattern =
          absl::StartsWith(glob, "/") ? glob : absl::StrCat(core.dataset_root(), "/", glob);
      for (const std::string& match : frontend::Glob(core, paths, pattern)) {
        if (const std::optional<FileEntry> entry = ns.Find(match)) {
          chosen[entry->ref.id] = true;
          continue;
        }
        // A directory: everything under it.
        std::string name;
        if (!paths.ToDatasetName(match, &name)) continue;
        const std::string prefix = name.empty() ? "" : name + "/";
        for (uint32_t id = 0; id < ns.file_count(); ++id) {
          if (absl::StartsWith(ns.entry(id).ref.name, prefix)) chosen[id] = true;
        }
      }
    }
    for (uint32_t id = 0; id < ns.file_count(); ++id) {
      if (chosen[id]) ids.push_back(id);
    }
  }
  // A file cached by extents is staged extent by extent (each counted as a
  // file): it never has a copy of its own.
  std::vector<uint32_t> copies;
  copies.reserve(ids.size());
  for (uint32_t id : ids) {
    const FileEntry& entry = ns.entry(id);
    if (entry.extent_count == 0) {
      copies.push_back(id);
      continue;
    }
    for (uint32_t k = 0; k < entry.extent_count; ++k) copies.push_back(entry.first_extent + k);
  }
  ids = std::move(copies);
  StageProgress progress;
  progress.files_total = ids.size();
  for (uint32_t id : ids) progress.bytes_total += ns.entry(id).ref.size;
  auto measure = [&] {
    progress.files_done = progress.bytes_done = progress.files_in_tiers = 0;
    for (uint32_t id : ids) {
      const FileEntry& entry = ns.entry(id);
      // An empty file has nothing to stage: it counts as staged, not as
      // one that found no room.
      const bool in_tier = entry.ref.size == 0 ||
                           (entry.tier->load(std::memory_order_acquire) < source &&
                            entry.state->load() == PlacementState::kInTier);
      const bool given_up = entry.state->load() == PlacementState::kStaysOnSource;
      if (in_tier) ++progress.files_in_tiers;
      if (in_tier || given_up) {
        ++progress.files_done;
        progress.bytes_done += entry.ref.size;
      }
    }
  };
  // Several stagers, as a DataLoader has workers: each miss waits for the
  // PFS, and one stager read MooseFS here at about 75 MiB/s, 8 at 136 MiB/s
  // (bench/results/stage_moosefs.md). More than 8 readers at once gain
  // nothing there (bench/results/moosefs_floor.md).
  constexpr size_t kStagers = 8;
  std::atomic<bool> client_gone{false};  // Nobody to report to: stop staging.
  // Until the stagers are through and every promotion has landed, reporting
  // as it goes. The wait ends when placement is idle, which a stop brings
  // about at once (it cancels).
  std::atomic<bool> idle{false};
  std::thread waiter([&] {
    ForEachInParallel(ids.size(), kStagers, /*per_thread=*/1, [&](size_t k) {
      if (stopping.load(std::memory_order_relaxed) || client_gone.load()) return;
      // One byte is enough: the first read of a file starts its promotion,
      // and placement completes it whatever part was read.
      const FileEntry& entry = ns.entry(ids[k]);
      if (entry.ref.size > 0 && entry.state->load() == PlacementState::kOnSource) {
        char scratch[1];
        core.ReadFile(ids[k], scratch, 1, 0).IgnoreError();
      }
    });
    core.WaitForPlacement();
    idle.store(true);
  });
  absl::Status sent;
  while (!idle.load() && sent.ok()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    measure();
    sent = SendFrame(socket, MessageType::kStageProgress, Encode(progress));
  }
  client_gone.store(!sent.ok());
  waiter.join();
  MONARCH_RETURN_IF_ERROR(sent);
  if (stopping.load(std::memory_order_relaxed)) return absl::CancelledError("stopping");
  measure();
  progress.finished = 1;
  return SendFrame(socket, MessageType::kStageProgress, Encode(progress));
}

}  // namespace monarch::service
