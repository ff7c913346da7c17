// Front implementation.

#include "core/front.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/counters.h"
#include "common/status_macros.h"

namespace monarch {
namespace {

// Debian's Abseil has its own string_view type; the public API uses std's.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status NoView() { return absl::UnavailableError("no Monarch service session"); }

}  // namespace

absl::StatusOr<uint64_t> Front::FileSize(std::string_view name) const {
  MONARCH_ASSIGN_OR_RETURN(FileStat stat, Stat(name));
  return stat.size;
}

absl::StatusOr<Monarch::FileStat> Front::Stat(std::string_view name) const {
  const NamespaceView* view = View();
  if (view == nullptr) return NoView();
  const std::optional<uint32_t> id = view->FindId(ToAbsl(name));
  if (!id) return absl::NotFoundError(absl::StrCat("not a dataset file: ", ToAbsl(name)));
  return view->Stat(*id);
}

bool Front::FileExists(std::string_view name) const {
  const NamespaceView* view = View();
  return view != nullptr && view->FindId(ToAbsl(name)).has_value();
}

bool Front::IsDirectory(std::string_view name) const {
  const NamespaceView* view = View();
  return view != nullptr && view->IsDirectory(ToAbsl(name));
}

absl::StatusOr<std::vector<std::string>> Front::ListDirectory(std::string_view dir) const {
  const NamespaceView* view = View();
  return view != nullptr ? view->List(ToAbsl(dir)) : NoView();
}

std::vector<std::string> Front::ListFiles() const {
  const NamespaceView* view = View();
  std::vector<std::string> names;
  for (uint32_t id = 0; view != nullptr && id < view->file_count(); ++id) {
    names.emplace_back(view->file_name(id));
  }
  std::sort(names.begin(), names.end());
  return names;
}

Stats Front::GetStats() const {
  Stats stats = NodeStats();
  if (const ReadSpeeds* speeds = Speeds()) {
    CounterSink sink(&stats);
    speeds->ReportCounters(sink);
  }
  return stats;
}

absl::Status Front::AnnounceOrder(const std::vector<std::string>& names) {
  return Announce(names.size(), [&names](size_t i) { return ToAbsl(names[i]); }, nullptr);
}

// Samples inside files, by file id: whoever announces knows which files are
// cached by extents, and fetches the extents each sample touches.
absl::Status Front::AnnounceRanges(const std::vector<SampleRange>& samples) {
  return Announce(samples.size(), [&samples](size_t i) { return ToAbsl(samples[i].file); },
                  &samples);
}

absl::Status Front::Announce(size_t count, absl::FunctionRef<absl::string_view(size_t)> name,
                             const std::vector<SampleRange>* samples) {
  for (int attempt = 0;; ++attempt) {
    const NamespaceView* view = View();
    if (view == nullptr) return NoView();
    std::vector<uint32_t> ids;
    std::vector<FileRange> ranges;
    for (size_t i = 0; i < count; ++i) {
      const std::optional<uint32_t> id = view->FindId(name(i));
      if (!id) {
        return absl::NotFoundError(
            absl::StrCat("announced order: not a dataset file: ", QuoteForError(name(i))));
      }
      if (samples != nullptr) {
        ranges.push_back({*id, (*samples)[i].offset, (*samples)[i].length});
      } else {
        ids.push_back(*id);
      }
    }
    absl::Status sent = AnnounceIds(*view, std::move(ids), std::move(ranges));
    // A new service instance answered: its ids may differ, look up again.
    if (absl::IsAborted(sent) && attempt < 3) continue;
    return sent;
  }
}

}  // namespace monarch
