// ForwardingDriver: a driver that passes every call to another one.
//
// Subclasses override only the calls they want to change, which keeps test
// drivers (fault injection, counting) and future decorators small.
// Thread-safety is that of the wrapped driver.

#ifndef MONARCH_DRIVERS_FORWARDING_DRIVER_H_
#define MONARCH_DRIVERS_FORWARDING_DRIVER_H_

#include <memory>

#include "drivers/storage_driver.h"

namespace monarch {

class ForwardingDriver : public StorageDriver {
 public:
  explicit ForwardingDriver(std::unique_ptr<StorageDriver> target) : target_(std::move(target)) {}

  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n) override {
    return target_->Read(file, offset, dst, n);
  }
  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) override {
    return target_->NewWriter(file);
  }
  absl::Status Remove(const FileRef& file) override { return target_->Remove(file); }
  absl::Status ScanCopies(CopyVisitor visit) override { return target_->ScanCopies(visit); }
  absl::StatusOr<SourceIdentity> Identify(const FileRef& file) override {
    return target_->Identify(file);
  }
  void ReportTierCounters(CounterSink& sink) const override { target_->ReportTierCounters(sink); }
  uint64_t ReleaseFreeMemory() override { return target_->ReleaseFreeMemory(); }

 protected:
  StorageDriver& target() { return *target_; }

 private:
  std::unique_ptr<StorageDriver> target_;
};

}  // namespace monarch

#endif  // MONARCH_DRIVERS_FORWARDING_DRIVER_H_
