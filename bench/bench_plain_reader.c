/* A plain C reader for the transparent-mode benchmark: the "same program"
 * that runs with and without LD_PRELOAD=libmonarch_preload.so. Only libc
 * calls, so everything it does goes through the interposed functions.
 *
 *   bench_plain_reader whole  LISTFILE         open, fstat, read to EOF, close
 *   bench_plain_reader chunks LISTFILE BYTES   open, pread BYTES at a time, close
 *   bench_plain_reader small  FILE BYTES COUNT open once, COUNT preads of BYTES
 *                                              at pseudo-random offsets
 *
 * LISTFILE holds one absolute path per line. Prints the bytes read, a
 * checksum of them (so the reads cannot be optimized away and two runs can
 * be compared) and the seconds the reading took. Exit status 1 on any error.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint64_t sum(const unsigned char* p, ssize_t n) {
  uint64_t s = 0;
  for (ssize_t i = 0; i < n; i += 64) s += p[i];
  return s;
}

static int read_list(const char* mode, const char* list, size_t chunk) {
  FILE* f = fopen(list, "r");
  if (f == NULL) {
    perror(list);
    return 1;
  }
  size_t capacity = 1 << 20;
  unsigned char* buffer = malloc(chunk > capacity ? chunk : capacity);
  char path[4096];
  uint64_t bytes = 0, checksum = 0;
  const double start = now();
  while (fgets(path, sizeof(path), f) != NULL) {
    path[strcspn(path, "\n")] = '\0';
    if (path[0] == '\0') continue;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      perror(path);
      return 1;
    }
    if (strcmp(mode, "whole") == 0) {
      struct stat st;
      if (fstat(fd, &st) != 0) {
        perror("fstat");
        return 1;
      }
      ssize_t n;
      while ((n = read(fd, buffer, capacity)) > 0) {
        bytes += (uint64_t)n;
        checksum += sum(buffer, n);
      }
      if (n < 0) {
        perror("read");
        return 1;
      }
    } else {
      off_t offset = 0;
      ssize_t n;
      while ((n = pread(fd, buffer, chunk, offset)) > 0) {
        bytes += (uint64_t)n;
        checksum += sum(buffer, n);
        offset += n;
      }
      if (n < 0) {
        perror("pread");
        return 1;
      }
    }
    close(fd);
  }
  printf("bytes %llu checksum %llu seconds %.6f\n", (unsigned long long)bytes,
         (unsigned long long)checksum, now() - start);
  return 0;
}

static int read_small(const char* path, size_t chunk, long count) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || (size_t)st.st_size < chunk) {
    perror(path);
    return 1;
  }
  unsigned char* buffer = malloc(chunk);
  const uint64_t slots = (uint64_t)st.st_size / chunk;
  uint64_t state = 88172645463325252ull, bytes = 0, checksum = 0;
  const double start = now();
  for (long i = 0; i < count; ++i) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    ssize_t n = pread(fd, buffer, chunk, (off_t)((state % slots) * chunk));
    if (n < 0) {
      perror("pread");
      return 1;
    }
    bytes += (uint64_t)n;
    checksum += sum(buffer, n);
  }
  printf("bytes %llu checksum %llu seconds %.6f\n", (unsigned long long)bytes,
         (unsigned long long)checksum, now() - start);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 3 && strcmp(argv[1], "whole") == 0) return read_list("whole", argv[2], 0);
  if (argc >= 4 && strcmp(argv[1], "chunks") == 0) {
    return read_list("chunks", argv[2], strtoul(argv[3], NULL, 10));
  }
  if (argc >= 5 && strcmp(argv[1], "small") == 0) {
    return read_small(argv[2], strtoul(argv[3], NULL, 10), strtol(argv[4], NULL, 10));
  }
  fprintf(stderr, "usage: %s whole LIST | chunks LIST BYTES | small FILE BYTES COUNT\n", argv[0]);
  return 2;
}
