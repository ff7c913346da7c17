/* Monarch C API: the same calls as monarch/monarch.h, for C callers, the
 * TensorFlow filesystem plugin and Python (ctypes).
 *
 * Status: every call returns a monarch_code (0 = OK). The codes are the
 * canonical absl/TensorFlow status codes, so a front end can map them 1:1
 * (MONARCH_NOT_FOUND = 5 = TF_NOT_FOUND, ...). When `error` is non-NULL and
 * the call fails, *error receives a malloc'ed message the caller frees with
 * monarch_free(); on success *error is set to NULL.
 *
 * NULL arguments never crash. A call returning monarch_code answers a NULL
 * pointer it needs with MONARCH_INVALID_ARGUMENT and a message naming the
 * argument; `error` may always be NULL, and `buffer` may be NULL when n is 0.
 * The calls returning int or a pointer answer 0 or NULL; monarch_close,
 * monarch_free, monarch_free_list and monarch_process_release ignore NULL.
 *
 * Threading: a monarch_t may be used from any number of threads at once,
 * except that monarch_close() must be the last call on it.
 */

#ifndef MONARCH_MONARCH_C_H_
#define MONARCH_MONARCH_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum monarch_code {
  MONARCH_OK = 0,
  MONARCH_CANCELLED = 1,
  MONARCH_UNKNOWN = 2,
  MONARCH_INVALID_ARGUMENT = 3,
  MONARCH_DEADLINE_EXCEEDED = 4,
  MONARCH_NOT_FOUND = 5,
  MONARCH_ALREADY_EXISTS = 6,
  MONARCH_PERMISSION_DENIED = 7,
  MONARCH_RESOURCE_EXHAUSTED = 8,
  MONARCH_FAILED_PRECONDITION = 9,
  MONARCH_ABORTED = 10,
  MONARCH_OUT_OF_RANGE = 11,
  MONARCH_UNIMPLEMENTED = 12,
  MONARCH_INTERNAL = 13,
  MONARCH_UNAVAILABLE = 14,
  MONARCH_DATA_LOSS = 15,
} monarch_code;

typedef struct monarch_t monarch_t;

/* Constructors. On failure *out is NULL. */
monarch_code monarch_open_yaml_file(const char* path, monarch_t** out, char** error);
monarch_code monarch_open_yaml_string(const char* yaml, monarch_t** out, char** error);
/* The embedded default: a RAM tier, then the source at dataset_dir. */
monarch_code monarch_open_default(const char* dataset_dir, monarch_t** out, char** error);
/* As the three above (exactly one of path, yaml and dataset_dir given), for
 * a front end whose readers are other processes (DataLoader workers, any
 * program that forks readers): node.shared is true unless the config sets
 * it, so that the readers of a node share one cache. */
monarch_code monarch_open_sharing_node(const char* path, const char* yaml, const char* dataset_dir,
                                       monarch_t** out, char** error);

/* Shuts down background placement (cancelling queued work) and frees. */
void monarch_close(monarch_t* m);

/* pread semantics: *bytes_read is short at end of file and 0 past it. */
monarch_code monarch_read(monarch_t* m, const char* name, void* buffer, size_t n, uint64_t offset,
                          size_t* bytes_read, char** error);

/* Monarch::MapCopies: in `mapping`, the caller's private mapping of bytes
 * [offset, offset + length) of `name` made from the source file, not yet
 * written to, maps each whole page a tier holds a copy of that may be
 * mapped (a posix or pmem copy checked whole, a RAM copy of 1 MiB or more)
 * from that copy instead (mmap `protection` and `flags`, of which
 * MAP_NORESERVE, MAP_LOCKED and MAP_POPULATE are kept). *mapped_bytes: how
 * many. On an error the caller must unmap the whole range. */
monarch_code monarch_map_copies(monarch_t* m, const char* name, void* mapping, uint64_t offset,
                                uint64_t length, int protection, int flags,
                                uint64_t* mapped_bytes, char** error);

monarch_code monarch_file_size(const monarch_t* m, const char* name, uint64_t* size, char** error);
/* Size and source modification time (nanoseconds since the epoch). */
monarch_code monarch_stat(const monarch_t* m, const char* name, uint64_t* size, int64_t* mtime_ns,
                          char** error);
/* 1 if true, 0 if false. */
int monarch_file_exists(const monarch_t* m, const char* name);
int monarch_is_directory(const monarch_t* m, const char* name);

/* Sorted names directly inside dir. Free the result with
 * monarch_free_list(names, count). */
monarch_code monarch_list_directory(const monarch_t* m, const char* dir, char*** names,
                                    size_t* count, char** error);
void monarch_free_list(char** names, size_t count);

/* The absolute dataset directory; valid until monarch_close(). */
const char* monarch_dataset_root(const monarch_t* m);

/* Counters as JSON, or in the Prometheus text format (malloc'ed; free with
 * monarch_free). */
char* monarch_stats_json(const monarch_t* m);
char* monarch_stats_prometheus(const monarch_t* m);

/* Waits until no promotion is queued or running. */
void monarch_wait_for_placement(monarch_t* m);

/* Clairvoyant prefetch: announces the order in which this process will read
 * `count` files (dataset names or paths inside the dataset), replacing any
 * earlier order; count 0 withdraws it. See Monarch::AnnounceOrder. A name
 * that is not a dataset file is MONARCH_NOT_FOUND, and nothing is announced. */
monarch_code monarch_announce_order(monarch_t* m, const char* const* names, size_t count,
                                    char** error);

/* As monarch_announce_order, with each of the `count` samples a range of a
 * file: `lengths[i]` bytes at `offsets[i]` of `names[i]` (length 0: to the
 * end). See Monarch::AnnounceRanges. */
monarch_code monarch_announce_ranges(monarch_t* m, const char* const* names,
                                     const uint64_t* offsets, const uint64_t* lengths,
                                     size_t count, char** error);

/* A read order as a seeded sampler, for the two calls below: what rank
 * `rank` of `world_size` reads in epochs first_epoch .. first_epoch +
 * epochs - 1 of a dataset of N samples, rebuilt exactly as
 * monarch/sampled_order.h specifies (torch's DistributedSampler in
 * behaviour: a shuffle per epoch, padded by repeating from the start to a
 * multiple of world_size, or cut with drop_last; the rank takes every
 * world_size-th position from `rank`). Bad values are
 * MONARCH_INVALID_ARGUMENT with a message naming the field. */
typedef struct monarch_sampled_order {
  uint64_t seed;
  uint64_t first_epoch;
  uint32_t epochs;     /* 1 .. 100 (the node service's longest order). */
  uint32_t rank;       /* < world_size. */
  uint32_t world_size; /* >= 1. */
  int32_t shuffle;     /* Nonzero: shuffled; 0: 0, 1, ..., N-1 every epoch. */
  int32_t drop_last;   /* Nonzero: cut to a multiple of world_size instead of padding. */
} monarch_sampled_order;

/* The sample indices (each < samples) that how->rank reads in epoch `epoch`
 * (how->first_epoch and how->epochs are not looked at), in order, into
 * indices[0 .. *count). *count always receives how many there are; with
 * capacity 0 (indices may then be NULL) the call only asks that. A smaller
 * nonzero capacity is MONARCH_INVALID_ARGUMENT, and nothing is written. */
monarch_code monarch_sampled_epoch(const monarch_sampled_order* how, uint64_t samples,
                                   uint64_t epoch, uint64_t* indices, size_t capacity,
                                   size_t* count, char** error);

/* Announces the order `how` describes over the dataset files files[0 ..
 * count): sample i reads files[i]. See Monarch::AnnounceSampledOrder;
 * otherwise as monarch_announce_order (replaces any earlier order; a name
 * that is not a dataset file is MONARCH_NOT_FOUND and nothing is
 * announced). */
monarch_code monarch_announce_sampled_order(monarch_t* m, const char* const* files, size_t count,
                                            const monarch_sampled_order* how, char** error);

void monarch_free(void* p);

/* 1 if `m` may go on being used in a child process made by fork() (a client
 * of the node service: the child remaps the service's shared tables and
 * makes its own connections), 0 if the child must open its own instance
 * (Monarch in process: its placement threads stay in the parent). */
int monarch_usable_after_fork(const monarch_t* m);

/* --- For front ends (the TensorFlow plugin, the preload library, Python). */

/* The process's shared instance, opened on the first call from the
 * environment: MONARCH_CONFIG (a YAML file) or else the embedded default over
 * MONARCH_DATASET. A failed open is reported once on stderr, prefixed with
 * `front_end`, and every later call returns the same error without retrying
 * (a missing config or dataset is MONARCH_FAILED_PRECONDITION, never
 * MONARCH_NOT_FOUND). Each success must be paired with
 * monarch_process_release(); at exit the instance is closed once the
 * acquired uses are released, and later acquires fail with MONARCH_CANCELLED.
 * Every success returns the same handle; monarch_close() ignores it. */
monarch_code monarch_process_acquire(const char* front_end, monarch_t** out, char** error);
void monarch_process_release(monarch_t* m);

/* If the absolute, clean `path` is the dataset root or below it (through the
 * root as given or its realpath), sets *name to the dataset name ("" for the
 * root; malloc'ed, free with monarch_free) and returns 1; else 0. */
int monarch_path_to_name(const monarch_t* m, const char* path, char** name);

/* Absolute paths of dataset files and directories matching `pattern`
 * (absolute; fnmatch() per path component, as glob(3)), sorted, from the
 * in-memory namespace. Free with monarch_free_list(paths, count). */
monarch_code monarch_glob(const monarch_t* m, const char* pattern, char*** paths, size_t* count,
                          char** error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MONARCH_MONARCH_C_H_ */
