// ForwardingDriver: a driver that passes every call to another one.
//
// Subclasses override only the calls they want to change, which keeps test
// drivers (fault injection, counting) and future decorators small. Of the
// capabilities, it passes on those that hand no bytes past Read() (copies
// kept across runs, backing memory, identity, which a subclass may
// override): a wrapped tier's bytes are all read through it.
// Thread-safety is that of the wrapped driver.

#ifndef MONARCH_DRIVERS_FORWARDING_DRIVER_H_
#define MONARCH_DRIVERS_FORWARDING_DRIVER_H_

#include <memory>

#include "drivers/storage_driver.h"

namespace monarch {

class ForwardingDriver : public StorageDriver, public FileIdentity {
 public:
  explicit ForwardingDriver(std::unique_ptr<StorageDriver> target)
      : target_(std::move(target)), target_can_(target_->capabilities()) {}

  absl::StatusOr<size_t> Read(const FileRef& file, uint64_t offset, char* dst, size_t n) override {
    return target_->Read(file, offset, dst, n);
  }
  absl::StatusOr<std::unique_ptr<CopyWriter>> NewWriter(const FileRef& file) override {
    return target_->NewWriter(file);
  }
  absl::Status Remove(const FileRef& file) override { return target_->Remove(file); }
  // Only if the target has the capability (capabilities()).
  absl::StatusOr<SourceIdentity> Identify(const FileRef& file,
                                          Clock::time_point opened_since) override {
    return target_can_.identity->Identify(file, opened_since);
  }
  void ReportTierCounters(CounterSink& sink) const override { target_->ReportTierCounters(sink); }
  DriverCapabilities capabilities() override {
    DriverCapabilities can;
    can.kept = target_can_.kept;
    can.memory = target_can_.memory;
    can.identity = target_can_.identity != nullptr ? this : nullptr;
    return can;
  }

 protected:
  StorageDriver& target() { return *target_; }

 private:
  std::unique_ptr<StorageDriver> target_;
  const DriverCapabilities target_can_;
};

}  // namespace monarch

#endif  // MONARCH_DRIVERS_FORWARDING_DRIVER_H_
