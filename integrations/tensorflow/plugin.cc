// Monarch's TensorFlow filesystem plugin: serves `monarch:///abs/path` URIs
// from the fastest Monarch tier holding the file.
//
// Shape: a thin C shim. TensorFlow loads this .so with
// tf.experimental.register_filesystem_plugin(), calls TF_InitPlugin() and then
// the op tables below, one namespace of static functions per table. Each op
// maps the path to a dataset name and delegates to the Monarch C API. Monarch
// is read-only, so the writable and memory-region tables stay null, which
// TensorFlow reports as "not supported".
//
// What every front end shares lives in the library (src/frontend/) and is
// reached through the C API: the process-wide instance opened from
// MONARCH_CONFIG or MONARCH_DATASET and closed at exit after the ops in
// flight (monarch_process_acquire), the mapping of paths to dataset names
// (monarch_path_to_name) and the glob over the namespace (monarch_glob).
// Only TensorFlow's conventions are here: status codes, the short read at
// the end of a file, allocation.
//
// Why the C API and not the C++ one: TensorFlow's headers bring their own
// Abseil, whose absl::Status differs from the one Monarch is built with; the
// C API keeps Abseil types out of this file.
//
// Threading: TensorFlow calls every op from many I/O threads at once; the
// C API and the process instance are thread-safe.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "monarch/monarch_c.h"
#include "tensorflow/c/experimental/filesystem/filesystem_interface.h"
#include "tensorflow/c/tf_status.h"

#define MONARCH_TF_EXPORT extern "C" __attribute__((visibility("default")))

namespace monarch_tf {
namespace {

// ---------------------------------------------------------------------------
// Status helpers.

// Monarch codes use the canonical numbering TensorFlow uses too; mapping each
// one by name keeps the plugin correct even if either enum ever drifts.
TF_Code ToTfCode(monarch_code code) {
  // clang-format off
  switch (code) {
    case MONARCH_OK: return TF_OK;
    case MONARCH_CANCELLED: return TF_CANCELLED;
    case MONARCH_UNKNOWN: return TF_UNKNOWN;
    case MONARCH_INVALID_ARGUMENT: return TF_INVALID_ARGUMENT;
    case MONARCH_DEADLINE_EXCEEDED: return TF_DEADLINE_EXCEEDED;
    case MONARCH_NOT_FOUND: return TF_NOT_FOUND;
    case MONARCH_ALREADY_EXISTS: return TF_ALREADY_EXISTS;
    case MONARCH_PERMISSION_DENIED: return TF_PERMISSION_DENIED;
    case MONARCH_RESOURCE_EXHAUSTED: return TF_RESOURCE_EXHAUSTED;
    case MONARCH_FAILED_PRECONDITION: return TF_FAILED_PRECONDITION;
    case MONARCH_ABORTED: return TF_ABORTED;
    case MONARCH_OUT_OF_RANGE: return TF_OUT_OF_RANGE;
    case MONARCH_UNIMPLEMENTED: return TF_UNIMPLEMENTED;
    case MONARCH_INTERNAL: return TF_INTERNAL;
    case MONARCH_UNAVAILABLE: return TF_UNAVAILABLE;
    case MONARCH_DATA_LOSS: return TF_DATA_LOSS;
  }
  // clang-format on
  return TF_UNKNOWN;
}

void SetOk(TF_Status* status) { TF_SetStatus(status, TF_OK, ""); }

void SetError(TF_Status* status, TF_Code code, const std::string& message) {
  TF_SetStatus(status, code, ("monarch: " + message).c_str());
}

// Sets `status` from a failed C API call and frees its message.
void SetFromMonarch(TF_Status* status, monarch_code code, char* error, const char* path) {
  std::string message = std::string(path) + ": " + (error != nullptr ? error : "error");
  monarch_free(error);
  SetError(status, ToTfCode(code), message);
}

void SetNotFound(TF_Status* status, const char* path) {
  SetError(status, TF_NOT_FOUND, std::string(path) + ": not a file or directory of the dataset");
}

// ---------------------------------------------------------------------------
// The process-wide Monarch instance.

constexpr char kFrontEnd[] = "monarch_tf";

// One op's use of the process instance: acquired on construction, released
// on destruction. On failure ok() is false and `status` is set.
class Session {
 public:
  explicit Session(TF_Status* status) {
    char* error = nullptr;
    monarch_code code = monarch_process_acquire(kFrontEnd, &monarch_, &error);
    if (code != MONARCH_OK) {
      SetError(status, ToTfCode(code), error != nullptr ? error : "error");
      monarch_free(error);
    }
  }
  ~Session() { monarch_process_release(monarch_); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  bool ok() const { return monarch_ != nullptr; }
  monarch_t* get() const { return monarch_; }

  // Maps a TensorFlow path (already cleaned by TensorFlow: "/data/set/a/b")
  // to Monarch's dataset-relative name ("a/b"; "" for the root). False for a
  // path outside the dataset root.
  bool ToDatasetName(const char* path, std::string* name) const {
    char* found = nullptr;
    if (monarch_path_to_name(monarch_, path, &found) == 0) return false;
    *name = found;
    monarch_free(found);
    return true;
  }

 private:
  monarch_t* monarch_ = nullptr;  // Null unless acquired.
};

// Memory handed to TensorFlow (tables, names, listings) comes from here;
// TF_InitPlugin gives TensorFlow the matching free, so both sides agree on
// the allocator whatever each was built with.
void* PluginAllocate(size_t size) { return std::malloc(size); }
void PluginFree(void* ptr) { std::free(ptr); }

char* CopyString(const char* s) {
  const size_t n = std::strlen(s) + 1;
  char* copy = static_cast<char*>(PluginAllocate(n));
  std::memcpy(copy, s, n);
  return copy;
}

// An open file: its dataset name and size, fixed for the instance's life.
struct File {
  std::string name;
  uint64_t size;
};

// ---------------------------------------------------------------------------
// TF_RandomAccessFileOps.
namespace tf_random_access_file {

void Cleanup(TF_RandomAccessFile* file) { delete static_cast<File*>(file->plugin_file); }

int64_t Read(const TF_RandomAccessFile* file, uint64_t offset, size_t n, char* buffer,
             TF_Status* status) {
  const File* f = static_cast<const File*>(file->plugin_file);
  Session session(status);
  if (!session.ok()) return -1;
  size_t total = 0;
  // One call is enough by the C API's pread contract; looping until the end
  // of the file guards against a short read mid-file, which TFRecord readers
  // would silently take for the end of the data.
  while (total < n && offset + total < f->size) {
    size_t got = 0;
    char* error = nullptr;
    monarch_code code = monarch_read(session.get(), f->name.c_str(), buffer + total, n - total,
                                     offset + total, &got, &error);
    if (code != MONARCH_OK) {
      SetFromMonarch(status, code, error, f->name.c_str());
      return -1;
    }
    if (got == 0) break;
    total += got;
  }
  if (total < n) {
    // TFRecord and buffered readers stop at OutOfRange, not at a short read.
    TF_SetStatus(status, TF_OUT_OF_RANGE, "Read less bytes than requested");
  } else {
    SetOk(status);
  }
  return static_cast<int64_t>(total);
}

}  // namespace tf_random_access_file

// ---------------------------------------------------------------------------
// TF_FilesystemOps.
namespace tf_filesystem {

// All state is process-wide (see Session), so there is nothing per filesystem.
void Init(TF_Filesystem* filesystem, TF_Status* status) {
  filesystem->plugin_filesystem = nullptr;
  SetOk(status);
}

void Cleanup(TF_Filesystem* /*filesystem*/) {}

void NewRandomAccessFile(const TF_Filesystem* /*filesystem*/, const char* path,
                         TF_RandomAccessFile* file, TF_Status* status) {
  Session session(status);
  if (!session.ok()) return;
  std::string name;
  if (!session.ToDatasetName(path, &name)) return SetNotFound(status, path);
  if (monarch_is_directory(session.get(), name.c_str())) {
    return SetError(status, TF_FAILED_PRECONDITION, std::string(path) + ": is a directory");
  }
  uint64_t size = 0;
  char* error = nullptr;
  monarch_code code = monarch_file_size(session.get(), name.c_str(), &size, &error);
  if (code != MONARCH_OK) return SetFromMonarch(status, code, error, path);
  file->plugin_file = new File{std::move(name), size};
  SetOk(status);
}

void PathExists(const TF_Filesystem* /*filesystem*/, const char* path, TF_Status* status) {
  Session session(status);
  if (!session.ok()) return;
  std::string name;
  if (session.ToDatasetName(path, &name) && (monarch_file_exists(session.get(), name.c_str()) ||
                                             monarch_is_directory(session.get(), name.c_str()))) {
    return SetOk(status);
  }
  SetNotFound(status, path);
}

void Stat(const TF_Filesystem* /*filesystem*/, const char* path, TF_FileStatistics* stats,
          TF_Status* status) {
  Session session(status);
  if (!session.ok()) return;
  std::string name;
  if (!session.ToDatasetName(path, &name)) return SetNotFound(status, path);
  // Directories have no modification time in the namespace; 0 means
  // "unknown" to TensorFlow.
  if (monarch_is_directory(session.get(), name.c_str())) {
    *stats = TF_FileStatistics{0, 0, true};
    return SetOk(status);
  }
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  char* error = nullptr;
  monarch_code code = monarch_stat(session.get(), name.c_str(), &size, &mtime_ns, &error);
  if (code != MONARCH_OK) return SetFromMonarch(status, code, error, path);
  *stats = TF_FileStatistics{static_cast<int64_t>(size), mtime_ns, false};
  SetOk(status);
}

// TensorFlow reads only the status: OK for a directory, FailedPrecondition
// for a file (its glob relies on that to decide where to descend).
bool IsDirectory(const TF_Filesystem* /*filesystem*/, const char* path, TF_Status* status) {
  Session session(status);
  if (!session.ok()) return false;
  std::string name;
  if (!session.ToDatasetName(path, &name)) {
    SetNotFound(status, path);
    return false;
  }
  if (monarch_is_directory(session.get(), name.c_str())) {
    SetOk(status);
    return true;
  }
  if (monarch_file_exists(session.get(), name.c_str())) {
    SetError(status, TF_FAILED_PRECONDITION, std::string(path) + ": not a directory");
  } else {
    SetNotFound(status, path);
  }
  return false;
}

int64_t GetFileSize(const TF_Filesystem* /*filesystem*/, const char* path, TF_Status* status) {
  Session session(status);
  if (!session.ok()) return -1;
  std::string name;
  if (!session.ToDatasetName(path, &name)) {
    SetNotFound(status, path);
    return -1;
  }
  if (monarch_is_directory(session.get(), name.c_str())) {
    SetError(status, TF_FAILED_PRECONDITION, std::string(path) + ": is a directory");
    return -1;
  }
  uint64_t size = 0;
  char* error = nullptr;
  monarch_code code = monarch_file_size(session.get(), name.c_str(), &size, &error);
  if (code != MONARCH_OK) {
    SetFromMonarch(status, code, error, path);
    return -1;
  }
  SetOk(status);
  return static_cast<int64_t>(size);
}

int GetChildren(const TF_Filesystem* /*filesystem*/, const char* path, char*** entries,
                TF_Status* status) {
  Session session(status);
  if (!session.ok()) return -1;
  std::string name;
  if (!session.ToDatasetName(path, &name)) {
    SetNotFound(status, path);
    return -1;
  }
  if (monarch_file_exists(session.get(), name.c_str())) {
    SetError(status, TF_FAILED_PRECONDITION, std::string(path) + ": not a directory");
    return -1;
  }
  char** names = nullptr;
  size_t count = 0;
  char* error = nullptr;
  monarch_code code = monarch_list_directory(session.get(), name.c_str(), &names, &count, &error);
  if (code != MONARCH_OK) {
    SetFromMonarch(status, code, error, path);
    return -1;
  }
  // Never allocate 0 bytes: a null array would be ambiguous to some callers.
  *entries = static_cast<char**>(PluginAllocate((count > 0 ? count : 1) * sizeof(char*)));
  for (size_t i = 0; i < count; ++i) (*entries)[i] = CopyString(names[i]);
  monarch_free_list(names, count);
  SetOk(status);
  return static_cast<int>(count);
}

// Why a glob of our own: TensorFlow's default glob drops every error, so with
// a bad config tf.data.Dataset.list_files() would only say "No files matched
// pattern". This one reports the config error, and matches against the
// in-memory namespace with the same per-component fnmatch() semantics.
int GetMatchingPaths(const TF_Filesystem* /*filesystem*/, const char* glob, char*** entries,
                     TF_Status* status) {
  Session session(status);
  if (!session.ok()) return -1;
  // TensorFlow passes the pattern as given: "monarch://host/abs/pattern".
  std::string pattern = glob;
  const std::string scheme = "monarch://";
  if (pattern.compare(0, scheme.size(), scheme) == 0) {
    const size_t path_start = pattern.find('/', scheme.size());
    pattern = path_start == std::string::npos ? "/" : pattern.substr(path_start);
  }
  char** found = nullptr;
  size_t count = 0;
  char* error = nullptr;
  monarch_code code = monarch_glob(session.get(), pattern.c_str(), &found, &count, &error);
  if (code != MONARCH_OK) {
    SetFromMonarch(status, code, error, glob);
    return -1;
  }
  std::vector<std::string> matches(found, found + count);
  monarch_free_list(found, count);
  *entries =
      static_cast<char**>(PluginAllocate((matches.empty() ? 1 : matches.size()) * sizeof(char*)));
  for (size_t i = 0; i < matches.size(); ++i) {
    (*entries)[i] = CopyString((scheme + matches[i]).c_str());
  }
  SetOk(status);
  return static_cast<int>(matches.size());
}

}  // namespace tf_filesystem

// Allocates a zeroed table with TensorFlow's allocator, so every op left
// unset is null ("not supported").
template <typename T>
T* NewZeroed() {
  T* table = static_cast<T*>(PluginAllocate(sizeof(T)));
  std::memset(table, 0, sizeof(T));
  return table;
}

void RegisterOps(TF_FilesystemPluginInfo* info) {
  info->plugin_memory_allocate = PluginAllocate;
  info->plugin_memory_free = PluginFree;

  info->num_schemes = 1;
  info->ops = NewZeroed<TF_FilesystemPluginOps>();
  TF_FilesystemPluginOps* ops = info->ops;
  TF_SetFilesystemVersionMetadata(ops);
  ops->scheme = CopyString("monarch");

  ops->random_access_file_ops = NewZeroed<TF_RandomAccessFileOps>();
  ops->random_access_file_ops->cleanup = tf_random_access_file::Cleanup;
  ops->random_access_file_ops->read = tf_random_access_file::Read;

  ops->filesystem_ops = NewZeroed<TF_FilesystemOps>();
  TF_FilesystemOps* fs = ops->filesystem_ops;
  fs->init = tf_filesystem::Init;
  fs->cleanup = tf_filesystem::Cleanup;
  fs->new_random_access_file = tf_filesystem::NewRandomAccessFile;
  fs->path_exists = tf_filesystem::PathExists;
  fs->stat = tf_filesystem::Stat;
  fs->is_directory = tf_filesystem::IsDirectory;
  fs->get_file_size = tf_filesystem::GetFileSize;
  fs->get_children = tf_filesystem::GetChildren;
  fs->get_matching_paths = tf_filesystem::GetMatchingPaths;
  // Writable files and memory regions: null tables, Monarch is read-only.
}

// Runs `fn(monarch_t*)` in a Session for the extras below, turning a failed
// open into its code and a malloc'ed message.
template <typename Fn>
int WithInstance(char** error, Fn fn) {
  TF_Status* status = TF_NewStatus();
  int code = MONARCH_OK;
  {
    Session session(status);
    if (session.ok()) {
      fn(session.get());
    } else {
      code = TF_GetCode(status);  // Same numbering as monarch_code.
      if (error != nullptr) *error = strdup(TF_Message(status));
    }
  }
  TF_DeleteStatus(status);
  return code;
}

}  // namespace
}  // namespace monarch_tf

MONARCH_TF_EXPORT void TF_InitPlugin(TF_FilesystemPluginInfo* info) {
  monarch_tf::RegisterOps(info);
}

// ---------------------------------------------------------------------------
// Extras for the monarch_tf Python module (ctypes on this same .so, so they
// see the very instance TensorFlow reads through). Each returns a
// monarch_code; messages and JSON are malloc'ed, freed with monarch_tf_free.

// Monarch's stats JSON (monarch_stats_json) for the plugin's instance,
// opening it if this is the first use.
MONARCH_TF_EXPORT int monarch_tf_stats_json(char** json, char** error) {
  *json = nullptr;
  if (error != nullptr) *error = nullptr;
  return monarch_tf::WithInstance(error, [&](monarch_t* m) {
    char* stats = monarch_stats_json(m);
    *json = strdup(stats);
    monarch_free(stats);
  });
}

// Blocks until no promotion is queued or running (monarch_wait_for_placement).
MONARCH_TF_EXPORT int monarch_tf_wait_for_placement(char** error) {
  if (error != nullptr) *error = nullptr;
  return monarch_tf::WithInstance(error, [](monarch_t* m) { monarch_wait_for_placement(m); });
}

MONARCH_TF_EXPORT void monarch_tf_free(void* p) { std::free(p); }
