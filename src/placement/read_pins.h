// ReadPins: the per-file pins that readers hold on a file's tier copy while
// they read it, and the reference bits that tell eviction's CLOCK which
// copies were read.
//
// A reader brackets every read of a tier copy with BeginTierRead() and
// EndTierRead(): BeginTierRead pins the file, marks it referenced and
// returns the tier that holds it now. Eviction (and demotion) first points
// the file at the source, then waits for the pins already taken to go
// (WaitForReaders) before it deletes the copy, so a reader never has a copy
// deleted under it; a reader that pins after the switch reads the source.
// Holders that are not reads of a tier copy (a reader of a promotion, which
// may read chunks back from the copy; a copy being moved down) use Pin() and
// Unpin(), which leave the reference bit alone.
//
// Why these memory orders: the pin's increment and the reader's load of the
// file's tier are seq_cst, as are eviction's store of the tier and its load
// of the pins, so that of the two (a reader pinning, an eviction switching
// the file to the source) at least one sees the other: either the reader
// sees the source, or the eviction sees the pin and waits. Unpinning is a
// release, so the reader's reads of the copy happen before the deletion
// that saw its pin go. The candidate check (IsPinned) is an acquire, and
// only a hint: the eviction waits again once the file is switched.
// Reference bits are relaxed: they are a hint for the CLOCK.
//
// With eviction on, BeginTierRead and EndTierRead are on the path of every
// tier hit, so they stay inline and do exactly this much: an atomic add and
// an atomic load to begin (and the reference bit, written only when it was
// clear), an atomic subtract to end.
//
// Lifetime: one slot per file of the namespace, allocated at construction
// (none when nothing evicts: no eviction policy and no RAM tier that memory
// pressure may shrink; then nobody pins, and only Touch() may be called). Thread-safe and lock-free: every call may be made from any
// thread.

#ifndef MONARCH_PLACEMENT_READ_PINS_H_
#define MONARCH_PLACEMENT_READ_PINS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "metadata/namespace.h"

namespace monarch {

class ReadPins final {
 public:
  // Slots for file ids [0, `files`); none if 0.
  explicit ReadPins(uint32_t files)
      : files_(files),
        readers_(files > 0 ? new std::atomic<uint32_t>[files]() : nullptr),
        referenced_(files > 0 ? new std::atomic<uint8_t>[files]() : nullptr) {}
  ReadPins(const ReadPins&) = delete;
  ReadPins& operator=(const ReadPins&) = delete;

  // Whether readers pin at all: slots were allocated (eviction, or a RAM
  // tier that memory pressure may shrink).
  bool has_slots() const { return files_ > 0; }

  // Reader side.

  // Pins `entry`'s copy, marks it referenced, and returns the tier to read
  // it from now (the source's index if it is in no cache tier). Every call
  // is paired with one EndTierRead(), whichever tier it returned.
  int BeginTierRead(const FileEntry& entry) {
    const uint32_t id = entry.ref.id;
    readers_[id].fetch_add(1, std::memory_order_seq_cst);
    // Written only when clear: a hit does not dirty the line each time.
    if (referenced_[id].load(std::memory_order_relaxed) == 0) {
      referenced_[id].store(1, std::memory_order_relaxed);
    }
    return entry.tier->load(std::memory_order_seq_cst);
  }
  void EndTierRead(uint32_t id) { readers_[id].fetch_sub(1, std::memory_order_release); }

  // A read this process did not serve itself (a node-service client's hit,
  // reported afterwards): counts as a use for the CLOCK. Ids out of range,
  // and any id without slots, are ignored.
  void Touch(uint32_t id) {
    if (id < files_) referenced_[id].store(1, std::memory_order_relaxed);
  }

  // Pins `id`'s copy without counting a use: for holders that may read the
  // copy but are not reads of the tier (see the banner). Unpin() once each.
  void Pin(uint32_t id) { readers_[id].fetch_add(1, std::memory_order_seq_cst); }
  void Unpin(uint32_t id) { readers_[id].fetch_sub(1, std::memory_order_release); }

  // Eviction side.

  // Whether a reader is inside `id`'s copy: a candidate to leave alone.
  bool IsPinned(uint32_t id) const { return readers_[id].load(std::memory_order_acquire) > 0; }
  // Waits until no more than `own` pins (the caller's) are left on `id`.
  // Called once the file points elsewhere, so new readers do not pin this
  // copy: each pin left is one read of the tier away.
  void WaitForReaders(uint32_t id, uint32_t own) const {
    while (readers_[id].load(std::memory_order_seq_cst) > own) std::this_thread::yield();
  }
  // The CLOCK's second chance: clears `id`'s reference bit and returns
  // whether it was set.
  bool TakeReference(uint32_t id) {
    return referenced_[id].exchange(0, std::memory_order_relaxed) != 0;
  }
  // Marks `id` as just used (a new copy, before it is published).
  void MarkReferenced(uint32_t id) { referenced_[id].store(1, std::memory_order_relaxed); }

 private:
  const uint32_t files_;
  // Readers inside each file's copy (and other holders, see Pin).
  const std::unique_ptr<std::atomic<uint32_t>[]> readers_;
  // Set when a copy is read, cleared when the CLOCK's hand passes it.
  const std::unique_ptr<std::atomic<uint8_t>[]> referenced_;
};

}  // namespace monarch

#endif  // MONARCH_PLACEMENT_READ_PINS_H_
