// The C API: thin wrappers over monarch::Monarch. Nothing here throws: a
// std::bad_alloc would terminate, which is what a C caller would get anyway.

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "frontend/dataset_paths.h"
#include "frontend/glob.h"
#include "api/process_instance.h"
#include "config/valid_config.h"
#include "monarch/monarch.h"
#include "monarch/monarch_c.h"
#include "monarch/sampled_order.h"
#include "service/client.h"

struct monarch_t {
  // Null for the process instance, which belongs to frontend::ProcessInstance.
  std::unique_ptr<monarch::Monarch> owned;
  monarch::Monarch* instance;
  monarch::frontend::DatasetPaths paths;
};

namespace {

char* CopyString(absl::string_view s) {
  char* copy = static_cast<char*>(std::malloc(s.size() + 1));
  if (copy == nullptr) return nullptr;
  std::memcpy(copy, s.data(), s.size());
  copy[s.size()] = '\0';
  return copy;
}

monarch_code Report(const absl::Status& status, char** error) {
  if (error != nullptr) *error = status.ok() ? nullptr : CopyString(status.ToString());
  return static_cast<monarch_code>(status.code());
}

monarch_code Open(absl::StatusOr<std::unique_ptr<monarch::Monarch>> created, monarch_t** out,
                  char** error) {
  *out = nullptr;
  if (!created.ok()) return Report(created.status(), error);
  monarch::Monarch* instance = created->get();
  *out = new monarch_t{std::move(*created), instance,
                       monarch::frontend::DatasetPaths(instance->dataset_root())};
  return Report(absl::OkStatus(), error);
}

// Returns the first of `args` (name, pointer) pairs whose pointer is NULL,
// as an INVALID_ARGUMENT status; OK when none is.
absl::Status CheckArguments(std::initializer_list<std::pair<const char*, const void*>> args) {
  for (const auto& [name, pointer] : args) {
    if (pointer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must not be NULL"));
    }
  }
  return absl::OkStatus();
}

// The same for an array of `count` strings named `what`: the array itself
// (unless empty), then each entry.
absl::Status CheckEntries(const char* what, const char* const* entries, size_t count) {
  if (count > 0 && entries == nullptr) return CheckArguments({{what, entries}});
  for (size_t i = 0; i < count; ++i) {
    if (entries[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] is NULL"));
    }
  }
  return absl::OkStatus();
}

// `strings` as a NULL-terminated array of malloc'ed copies, for
// monarch_free_list.
char** CopyList(const std::vector<std::string>& strings, size_t* count) {
  char** list = static_cast<char**>(std::calloc(strings.size() + 1, sizeof(char*)));
  for (size_t i = 0; i < strings.size(); ++i) list[i] = CopyString(strings[i]);
  *count = strings.size();
  return list;
}

// Python declares this struct field by field (ctypes, python/monarch/_lib.py):
// a change of layout must change it there too.
static_assert(sizeof(monarch_sampled_order) == 40 &&
                  offsetof(monarch_sampled_order, epochs) == 16 &&
                  offsetof(monarch_sampled_order, drop_last) == 32,
              "monarch_sampled_order's layout is part of the ABI");

monarch::SampledOrder ToSampledOrder(const monarch_sampled_order& how) {
  monarch::SampledOrder order;
  order.seed = how.seed;
  order.first_epoch = how.first_epoch;
  order.epochs = how.epochs;
  order.shuffle = how.shuffle != 0;
  order.rank = how.rank;
  order.world_size = how.world_size;
  order.drop_last = how.drop_last != 0;
  return order;
}

#define MONARCH_C_RETURN_IF_ERROR(error, expr)          \
  do {                                                  \
    absl::Status checked_ = (expr);                     \
    if (!checked_.ok()) return Report(checked_, error); \
  } while (false)

#define MONARCH_C_CHECK(error, ...) MONARCH_C_RETURN_IF_ERROR(error, CheckArguments({__VA_ARGS__}))

}  // namespace

extern "C" {

monarch_code monarch_open_yaml_file(const char* path, monarch_t** out, char** error) {
  MONARCH_C_CHECK(error, {"out", out});
  *out = nullptr;
  MONARCH_C_CHECK(error, {"path", path});
  return Open(monarch::Monarch::CreateFromYamlFile(path), out, error);
}

monarch_code monarch_open_yaml_string(const char* yaml, monarch_t** out, char** error) {
  MONARCH_C_CHECK(error, {"out", out});
  *out = nullptr;
  MONARCH_C_CHECK(error, {"yaml", yaml});
  return Open(monarch::Monarch::CreateFromYamlString(yaml), out, error);
}

monarch_code monarch_open_default(const char* dataset_dir, monarch_t** out, char** error) {
  MONARCH_C_CHECK(error, {"out", out});
  *out = nullptr;
  MONARCH_C_CHECK(error, {"dataset_dir", dataset_dir});
  return Open(monarch::Monarch::Create(monarch::DefaultConfig(dataset_dir)), out, error);
}

monarch_code monarch_open_sharing_node(const char* path, const char* yaml, const char* dataset_dir,
                                       monarch_t** out, char** error) {
  MONARCH_C_CHECK(error, {"out", out});
  *out = nullptr;
  if ((path != nullptr) + (yaml != nullptr) + (dataset_dir != nullptr) != 1) {
    return Report(absl::InvalidArgumentError(
                      "exactly one of path, yaml and dataset_dir must be given"),
                  error);
  }
  if (path != nullptr) return Open(monarch::Monarch::CreateFromYamlFile(path, true), out, error);
  // The embedded default as text: a service started for it must run it.
  const std::string text = yaml != nullptr ? yaml : monarch::DefaultConfigYaml(dataset_dir);
  return Open(monarch::Monarch::CreateFromYamlString(text, true), out, error);
}

void monarch_close(monarch_t* m) {
  if (m != nullptr && m->owned != nullptr) delete m;
}

monarch_code monarch_process_acquire(const char* front_end, monarch_t** out, char** error) {
  MONARCH_C_CHECK(error, {"out", out});
  *out = nullptr;
  absl::StatusOr<monarch::Monarch*> acquired = monarch::frontend::ProcessInstance::Get().Acquire(
      front_end != nullptr ? front_end : "monarch");
  if (!acquired.ok()) return Report(acquired.status(), error);
  // One handle for the process, made on the first success and never freed
  // (see ProcessInstance on why the holder outlives exit).
  static monarch_t* const handle =
      new monarch_t{nullptr, *acquired, monarch::frontend::ProcessInstance::Get().paths()};
  *out = handle;
  return Report(absl::OkStatus(), error);
}

void monarch_process_release(monarch_t* m) {
  if (m != nullptr && m->owned == nullptr) monarch::frontend::ProcessInstance::Get().Release();
}

int monarch_path_to_name(const monarch_t* m, const char* path, char** name) {
  if (name == nullptr) return 0;
  *name = nullptr;
  std::string found;
  if (m == nullptr || path == nullptr || !m->paths.ToDatasetName(path, &found)) return 0;
  *name = CopyString(found);
  return 1;
}

monarch_code monarch_glob(const monarch_t* m, const char* pattern, char*** paths, size_t* count,
                          char** error) {
  MONARCH_C_CHECK(error, {"paths", paths}, {"count", count});
  *paths = nullptr;
  *count = 0;
  MONARCH_C_CHECK(error, {"m", m}, {"pattern", pattern});
  const std::vector<std::string> matches =
      monarch::frontend::Glob(*m->instance, m->paths, pattern);
  *paths = CopyList(matches, count);
  return Report(absl::OkStatus(), error);
}

monarch_code monarch_read(monarch_t* m, const char* name, void* buffer, size_t n, uint64_t offset,
                          size_t* bytes_read, char** error) {
  MONARCH_C_CHECK(error, {"bytes_read", bytes_read});
  *bytes_read = 0;
  MONARCH_C_CHECK(error, {"m", m}, {"name", name});
  if (n > 0) MONARCH_C_CHECK(error, {"buffer", buffer});
  absl::StatusOr<size_t> result = m->instance->Read(name, buffer, n, offset);
  if (result.ok()) *bytes_read = *result;
  return Report(result.status(), error);
}

monarch_code monarch_map_copies(monarch_t* m, const char* name, void* mapping, uint64_t offset,
                                uint64_t length, int protection, int flags,
                                uint64_t* mapped_bytes, char** error) {
  MONARCH_C_CHECK(error, {"mapped_bytes", mapped_bytes});
  *mapped_bytes = 0;
  MONARCH_C_CHECK(error, {"m", m}, {"name", name}, {"mapping", mapping});
  absl::StatusOr<uint64_t> result =
      m->instance->MapCopies(name, mapping, offset, length, protection, flags);
  if (result.ok()) *mapped_bytes = *result;
  return Report(result.status(), error);
}

monarch_code monarch_file_size(const monarch_t* m, const char* name, uint64_t* size, char** error) {
  MONARCH_C_CHECK(error, {"size", size});
  *size = 0;
  MONARCH_C_CHECK(error, {"m", m}, {"name", name});
  absl::StatusOr<uint64_t> result = m->instance->FileSize(name);
  if (result.ok()) *size = *result;
  return Report(result.status(), error);
}

monarch_code monarch_stat(const monarch_t* m, const char* name, uint64_t* size, int64_t* mtime_ns,
                          char** error) {
  MONARCH_C_CHECK(error, {"size", size}, {"mtime_ns", mtime_ns});
  *size = 0;
  *mtime_ns = 0;
  MONARCH_C_CHECK(error, {"m", m}, {"name", name});
  absl::StatusOr<monarch::Monarch::FileStat> stat = m->instance->Stat(name);
  if (stat.ok()) {
    *size = stat->size;
    *mtime_ns = stat->mtime_ns;
  }
  return Report(stat.status(), error);
}

int monarch_file_exists(const monarch_t* m, const char* name) {
  return m != nullptr && name != nullptr && m->instance->FileExists(name) ? 1 : 0;
}

int monarch_is_directory(const monarch_t* m, const char* name) {
  return m != nullptr && name != nullptr && m->instance->IsDirectory(name) ? 1 : 0;
}

monarch_code monarch_list_directory(const monarch_t* m, const char* dir, char*** names,
                                    size_t* count, char** error) {
  MONARCH_C_CHECK(error, {"names", names}, {"count", count});
  *names = nullptr;
  *count = 0;
  MONARCH_C_CHECK(error, {"m", m}, {"dir", dir});
  absl::StatusOr<std::vector<std::string>> listed = m->instance->ListDirectory(dir);
  if (!listed.ok()) return Report(listed.status(), error);
  *names = CopyList(*listed, count);
  return Report(absl::OkStatus(), error);
}

void monarch_free_list(char** names, size_t count) {
  if (names == nullptr) return;
  for (size_t i = 0; i < count; ++i) std::free(names[i]);
  std::free(names);
}

const char* monarch_dataset_root(const monarch_t* m) {
  return m != nullptr ? m->instance->dataset_root().c_str() : nullptr;
}

char* monarch_stats_json(const monarch_t* m) {
  return m != nullptr ? CopyString(m->instance->GetStats().ToJson()) : nullptr;
}

char* monarch_stats_prometheus(const monarch_t* m) {
  return m != nullptr ? CopyString(m->instance->GetStats().ToPrometheus()) : nullptr;
}

void monarch_wait_for_placement(monarch_t* m) {
  if (m != nullptr) m->instance->WaitForPlacement();
}

monarch_code monarch_announce_order(monarch_t* m, const char* const* names, size_t count,
                                    char** error) {
  MONARCH_C_CHECK(error, {"m", m});
  MONARCH_C_RETURN_IF_ERROR(error, CheckEntries("names", names, count));
  return Report(m->instance->AnnounceOrder(std::vector<std::string>(names, names + count)), error);
}

monarch_code monarch_announce_ranges(monarch_t* m, const char* const* names,
                                     const uint64_t* offsets, const uint64_t* lengths,
                                     size_t count, char** error) {
  MONARCH_C_CHECK(error, {"m", m});
  if (count > 0) {
    MONARCH_C_CHECK(error, {"names", names}, {"offsets", offsets}, {"lengths", lengths});
  }
  std::vector<monarch::Monarch::SampleRange> samples;
  samples.reserve(count);
  MONARCH_C_RETURN_IF_ERROR(error, CheckEntries("names", names, count));
  for (size_t i = 0; i < count; ++i) samples.push_back({names[i], offsets[i], lengths[i]});
  return Report(m->instance->AnnounceRanges(samples), error);
}

monarch_code monarch_sampled_epoch(const monarch_sampled_order* how, uint64_t samples,
                                   uint64_t epoch, uint64_t* indices, size_t capacity,
                                   size_t* count, char** error) {
  MONARCH_C_CHECK(error, {"count", count});
  *count = 0;
  MONARCH_C_CHECK(error, {"how", how});
  if (capacity > 0) MONARCH_C_CHECK(error, {"indices", indices});
  const monarch::SampledOrder order = ToSampledOrder(*how);
  // The length first: a size query need not build the permutation.
  absl::StatusOr<uint64_t> length = monarch::SampledEpochLength(order, samples);
  if (!length.ok()) return Report(length.status(), error);
  *count = static_cast<size_t>(*length);
  if (capacity == 0) return Report(absl::OkStatus(), error);
  if (capacity < *length) {
    return Report(absl::InvalidArgumentError(absl::StrCat(
                      "capacity ", capacity, " is less than the ", *length, " indices of the epoch")),
                  error);
  }
  absl::StatusOr<std::vector<uint64_t>> epoch_indices =
      monarch::SampledEpochIndices(order, samples, epoch);
  if (!epoch_indices.ok()) return Report(epoch_indices.status(), error);
  std::copy(epoch_indices->begin(), epoch_indices->end(), indices);
  return Report(absl::OkStatus(), error);
}

monarch_code monarch_announce_sampled_order(monarch_t* m, const char* const* files, size_t count,
                                            const monarch_sampled_order* how, char** error) {
  MONARCH_C_CHECK(error, {"m", m}, {"how", how});
  MONARCH_C_RETURN_IF_ERROR(error, CheckEntries("files", files, count));
  return Report(m->instance->AnnounceSampledOrder(std::vector<std::string>(files, files + count),
                                                  ToSampledOrder(*how)),
                error);
}

int monarch_usable_after_fork(const monarch_t* m) {
  return m != nullptr && monarch::service::IsServiceClient(*m->instance) ? 1 : 0;
}

void monarch_free(void* p) { std::free(p); }

}  // extern "C"
