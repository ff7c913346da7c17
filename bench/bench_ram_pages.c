// What the page size of a tmpfs costs a reader of RAM copies, without
// Monarch: a file of SIZE MiB is filled through a mapping (the service's
// writes), then a process maps it afresh and 2 threads copy it out in
// random 112 KiB records (an ImageNet-like file each), once as a new
// process does (every page a first touch) and three times more with the
// mapping warm (a process that keeps it). Also one pass of pread() over a
// fresh descriptor, which a forked DataLoader worker uses (RamReader).
//
//   bench_ram_pages FILE SIZE_MIB [--collapse]
//
// Run it on /dev/shm (4 KiB pages here) and on a tmpfs mounted
// huge=within_size, in turns (bench/results/ram_pages/README.md).
// --collapse allocates the file as 2 MiB folios with no administrator: per
// 2 MiB block, its first page, then MADV_COLLAPSE into one folio (Linux
// 6.1), as a RAM tier tried and reverted did (bench/results/ram_pages/).
// It prints that time against allocating the same pages 4 KiB at a time
// (MADV_POPULATE_WRITE) in a second file; the reads then run over the
// collapsed file.

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static const size_t kRecord = 112 << 10;
static char* mapped;
static int fd;
static size_t records;
static size_t* order;
static int use_pread;

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static void* Reader(void* arg) {
  const long id = (long)arg;
  char* buffer = aligned_alloc(4096, kRecord);
  memset(buffer, 0, kRecord);  // Touched before the clock matters.
  unsigned long sum = 0;
  for (size_t i = (size_t)id; i < records; i += 2) {
    const size_t at = order[i] * kRecord;
    if (use_pread) {
      if (pread(fd, buffer, kRecord, (off_t)at) != (ssize_t)kRecord) abort();
    } else {
      memcpy(buffer, mapped + at, kRecord);
    }
    sum += (unsigned char)buffer[at % kRecord];
  }
  free(buffer);
  return (void*)sum;
}

static double Pass(int with_pread) {
  use_pread = with_pread;
  pthread_t threads[2];
  const double began = Now();
  for (long i = 0; i < 2; ++i) pthread_create(&threads[i], NULL, Reader, (void*)i);
  for (int i = 0; i < 2; ++i) pthread_join(threads[i], NULL);
  return Now() - began;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
static const size_t kHuge = 2 << 20;

// A shared mapping of `size` bytes of `file` at a 2 MiB boundary, where
// the kernel maps a 2 MiB folio with one page-table entry.
static char* MapAligned(int file, size_t size, int protection) {
  char* reserved = mmap(NULL, size + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (reserved == MAP_FAILED) return MAP_FAILED;
  char* at = (char*)(((uintptr_t)reserved + kHuge - 1) & ~(uintptr_t)(kHuge - 1));
  return mmap(at, size, protection, MAP_SHARED | MAP_FIXED, file, 0);
}

// Allocates a file's pages: 4 KiB at a time, or per 2 MiB block one page
// then MADV_COLLAPSE. Returns the seconds taken, or -1.
static double Allocate(char* writer, size_t size, int collapse) {
  const double began = Now();
  for (size_t at = 0; at < size; at += kHuge) {
    if (collapse) {
      if (madvise(writer + at, 4096, MADV_POPULATE_WRITE) != 0 ||
          madvise(writer + at, kHuge, MADV_COLLAPSE) != 0) {
        fprintf(stderr, "MADV_COLLAPSE: %s\n", strerror(errno));
        return -1;
      }
    } else if (madvise(writer + at, kHuge, MADV_POPULATE_WRITE) != 0) {
      perror("MADV_POPULATE_WRITE");
      return -1;
    }
  }
  return Now() - began;
}

int main(int argc, char** argv) {
  const int collapse = argc == 4 && strcmp(argv[3], "--collapse") == 0;
  if (argc != 3 && !collapse) {
    fprintf(stderr, "usage: %s FILE SIZE_MIB [--collapse]\n", argv[0]);
    return 2;
  }
  const size_t size = ((size_t)atol(argv[2]) << 20) / kHuge * kHuge;
  fd = open(argv[1], O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
    perror(argv[1]);
    return 1;
  }
  char* writer = MapAligned(fd, size, PROT_READ | PROT_WRITE);
  if (writer == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  if (collapse) {
    // The same allocation 4 KiB at a time, into a second file beside it.
    char other[4096];
    snprintf(other, sizeof(other), "%s.4k", argv[1]);
    const int other_fd = open(other, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (other_fd < 0 || ftruncate(other_fd, (off_t)size) != 0) {
      perror(other);
      return 1;
    }
    char* other_writer = MapAligned(other_fd, size, PROT_READ | PROT_WRITE);
    const double pages = other_writer == MAP_FAILED ? -1 : Allocate(other_writer, size, 0);
    unlink(other);
    if (other_writer != MAP_FAILED) munmap(other_writer, size);
    close(other_fd);
    const double folios = Allocate(writer, size, 1);
    if (pages < 0 || folios < 0) return 1;
    printf("%s: allocating %zu MiB: 4 KiB pages %.3f s, 2 MiB folios by MADV_COLLAPSE %.3f s\n",
           argv[1], size >> 20, pages, folios);
  }
  memset(writer, 1, size);
  munmap(writer, size);
  records = size / kRecord;
  order = malloc(records * sizeof(size_t));
  for (size_t i = 0; i < records; ++i) order[i] = i;
  srand(1);
  for (size_t i = records - 1; i > 0; --i) {
    const size_t j = (size_t)rand() % (i + 1);
    const size_t x = order[i];
    order[i] = order[j];
    order[j] = x;
  }
  const double with_pread = Pass(1);
  mapped = MapAligned(fd, size, PROT_READ);
  if (mapped == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  const double first = Pass(0);
  const double hot[3] = {Pass(0), Pass(0), Pass(0)};
  printf("%s: pread %.3f s; mapping: first touch %.3f s, warm %.3f %.3f %.3f s\n", argv[1],
         with_pread, first, hot[0], hot[1], hot[2]);
  unlink(argv[1]);
  return 0;
}
