// StageAhead implementation.

#include "placement/stage_ahead.h"

#include "common/log.h"

namespace monarch {

absl::string_view StageAhead::GroupOf(absl::string_view name) {
  const size_t slash = name.find('/');
  return slash == absl::string_view::npos ? absl::string_view() : name.substr(0, slash);
}

void StageAhead::IndexLocked() {
  indexed_ = true;
  for (uint32_t id = 0; id < namespace_->file_count(); ++id) {
    const FileEntry& entry = namespace_->entry(id);
    if (entry.ref.size == 0) continue;
    Group& group = groups_[GroupOf(entry.ref.name)];
    group.bytes += entry.ref.size;
    if (entry.extent_count == 0) {
      group.ids.push_back(id);
    } else {
      for (uint32_t k = 0; k < entry.extent_count; ++k) group.ids.push_back(entry.first_extent + k);
    }
  }
}

void StageAhead::OnMiss(uint32_t id) {
  // A reader's own order comes first, and makes staging moot.
  if (prefetcher_->known() || id >= namespace_->entry_count()) return;
  const absl::string_view name = namespace_->entry(id).ref.source_file().name;
  MutexLock lock(&mu_);
  if (!indexed_) IndexLocked();
  auto it = groups_.find(GroupOf(name));
  if (it == groups_.end() || it->second.decided) return;
  Group& group = it->second;
  group.decided = true;
  // Staging past the room would evict what it staged.
  if (staged_bytes_ + group.bytes > room_()) return;
  const size_t files = group.ids.size();
  if (!prefetcher_->StageAhead(std::move(group.ids))) return;
  staged_bytes_ += group.bytes;
  MONARCH_LOG(kInfo, "no read order announced: staging ",
              it->first.empty() ? std::string("the dataset root's files")
                                : std::string(it->first) + "/",
              " (", files, " files, ", group.bytes,
              " bytes) into the tiers ahead of the readers (prefetch.stage_ahead)");
}

}  // namespace monarch
