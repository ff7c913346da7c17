// Internal construction hook, for tests and tools inside this repository.
//
// Lets a caller wrap each tier's driver (for example in a fault-injecting
// driver) before the instance starts. Not part of the public API.

#ifndef MONARCH_MONARCH_INTERNAL_H_
#define MONARCH_MONARCH_INTERNAL_H_

#include <functional>
#include <memory>

#include "drivers/storage_driver.h"
#include "monarch/monarch.h"

namespace monarch {

// Receives tier index and the driver built from the config; returns the
// driver to use (the same one, or a wrapper around it).
using DriverWrapper =
    std::function<std::unique_ptr<StorageDriver>(int tier, std::unique_ptr<StorageDriver>)>;

absl::StatusOr<std::unique_ptr<Monarch>> CreateMonarchWithDriverWrapper(const Config& config,
                                                                        const DriverWrapper& wrap);

}  // namespace monarch

#endif  // MONARCH_MONARCH_INTERNAL_H_
