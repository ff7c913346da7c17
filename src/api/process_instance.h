// ProcessInstance: the one Monarch instance of a process, shared by every
// front end (the TensorFlow plugin, the preload library, the Python package).
//
// Opened on first use from the environment: MONARCH_CONFIG (a YAML file), or
// failing that the embedded default over MONARCH_DATASET. A failed open is
// remembered, reported once on stderr, and returned by every later use, so a
// bad config is never retried. A missing config file or dataset is
// FailedPrecondition, not NotFound: a front end turns NotFound into "no such
// file" and the cause would be lost.
//
// Exit: an atexit handler refuses new uses, waits for the ones in progress
// and shuts the instance down (placement threads stop before static
// destructors run). The holder itself is leaked on purpose, so threads still
// running during exit find a "closed" flag instead of a destroyed mutex.
//
// Thread-safe: any number of threads may hold a Use at once.

#ifndef MONARCH_API_PROCESS_INSTANCE_H_
#define MONARCH_API_PROCESS_INSTANCE_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "frontend/dataset_paths.h"
#include "monarch/monarch.h"

namespace monarch::frontend {

class ProcessInstance {
 public:
  // The process's instance holder (not yet opened).
  static ProcessInstance& Get();

  // One use of the instance: opens it if this is the first, and keeps it
  // from being closed until destroyed. `front_end` names the caller in the
  // one stderr line a failed open prints ("monarch_tf: cannot start ...").
  class Use {
   public:
    explicit Use(std::string_view front_end, ProcessInstance& holder = Get());
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

    // OK, or why there is no instance (the open failed, or the process is
    // exiting: Cancelled).
    const absl::Status& status() const { return status_; }
    bool ok() const { return monarch_ != nullptr; }
    Monarch& monarch() const { return *monarch_; }
    Monarch* operator->() const { return monarch_; }
    const DatasetPaths& paths() const { return holder_.paths(); }

   private:
    ProcessInstance& holder_;
    Monarch* monarch_ = nullptr;  // Set only while this use counts as active.
    absl::Status status_;
  };

  // The same without RAII, for the C API (monarch_process_acquire): on
  // success the instance stays open until the matching Release().
  absl::StatusOr<Monarch*> Acquire(std::string_view front_end);
  void Release();
  // The instance's paths; valid once an Acquire() has succeeded.
  const DatasetPaths& paths() const { return *paths_; }

  ProcessInstance(const ProcessInstance&) = delete;
  ProcessInstance& operator=(const ProcessInstance&) = delete;

 private:
  ProcessInstance() = default;
  void Open(std::string_view front_end);
  static void CloseAtExit();

  Mutex open_mu_;
  bool open_attempted_ ABSL_GUARDED_BY(open_mu_) = false;
  // Written once under open_mu_ before open_attempted_ is set, then read-only.
  std::unique_ptr<Monarch> monarch_;
  std::unique_ptr<DatasetPaths> paths_;
  absl::Status open_status_;

  Mutex mu_;
  CondVar idle_;                       // Signalled when active_ drops to 0.
  int active_ ABSL_GUARDED_BY(mu_) = 0;  // Uses in progress.
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace monarch::frontend

#endif  // MONARCH_API_PROCESS_INSTANCE_H_
