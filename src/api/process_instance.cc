// ProcessInstance implementation.

#include "api/process_instance.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/shutdown.h"

namespace monarch::frontend {

ProcessInstance& ProcessInstance::Get() {
  static ProcessInstance* holder = new ProcessInstance;  // Leaked: see the banner.
  return *holder;
}

void ProcessInstance::Open(std::string_view front_end) {
  const char* config = std::getenv("MONARCH_CONFIG");
  const char* dataset = std::getenv("MONARCH_DATASET");
  std::string what;
  absl::StatusOr<std::unique_ptr<Monarch>> created;
  if (config != nullptr && config[0] != '\0') {
    what = absl::StrCat("config '", config, "'");
    created = Monarch::CreateFromYamlFile(config);
  } else if (dataset != nullptr && dataset[0] != '\0') {
    what = absl::StrCat("default config over MONARCH_DATASET '", dataset, "'");
    created = Monarch::Create(DefaultConfig(dataset));
  } else {
    created = absl::FailedPreconditionError(
        "not configured: set MONARCH_CONFIG to a YAML config file or MONARCH_DATASET to the "
        "dataset directory before the first access");
  }
  if (created.ok()) {
    monarch_ = std::move(*created);
    paths_ = std::make_unique<DatasetPaths>(monarch_->dataset_root());
    std::atexit(CloseAtExit);
    return;
  }
  absl::Status status = created.status();
  const absl::StatusCode code = absl::IsNotFound(status) ? absl::StatusCode::kFailedPrecondition
                                                         : status.code();
  open_status_ = absl::Status(code, what.empty() ? std::string(status.message())
                                                 : absl::StrCat("cannot start from ", what, ": ",
                                                                status.message()));
  std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(front_end.size()), front_end.data(),
               std::string(open_status_.message()).c_str());
}

absl::StatusOr<Monarch*> ProcessInstance::Acquire(std::string_view front_end) {
  {
    MutexLock lock(&open_mu_);
    if (!open_attempted_) {
      Open(front_end);
      open_attempted_ = true;
    }
  }
  if (!open_status_.ok()) return open_status_;
  MutexLock lock(&mu_);
  if (closed_) return absl::CancelledError("the Monarch instance was closed at process exit");
  ++active_;
  return monarch_.get();
}

void ProcessInstance::Release() {
  MutexLock lock(&mu_);
  if (--active_ == 0) idle_.SignalAll();
}

ProcessInstance::Use::Use(std::string_view front_end, ProcessInstance& holder) : holder_(holder) {
  absl::StatusOr<Monarch*> acquired = holder_.Acquire(front_end);
  if (acquired.ok()) {
    monarch_ = *acquired;
  } else {
    status_ = acquired.status();
  }
}

ProcessInstance::Use::~Use() {
  if (monarch_ != nullptr) holder_.Release();
}

// Refuses new uses first, then waits for the running ones, so a steady
// stream of reads from a framework's threads cannot hold up the exit. A read
// that does not end (a file system that stopped answering) does not either:
// after a few seconds the instance shuts down under it (reads stay safe
// during and after a shutdown) and the process goes on exiting.
void ProcessInstance::CloseAtExit() {
  ProcessInstance& holder = Get();
  {
    MutexLock lock(&holder.mu_);
    holder.closed_ = true;
    const Deadline give_up = DeadlineIn(kCancelGraceSeconds);
    while (holder.active_ > 0) {
      if (!holder.idle_.WaitUntil(&holder.mu_, give_up) && holder.active_ > 0) {
        std::fprintf(stderr, "monarch: exiting with %d reads still in progress\n", holder.active_);
        break;
      }
    }
  }
  holder.monarch_->Shutdown(Monarch::ShutdownMode::kCancel);
}

}  // namespace monarch::frontend
