// What the page size of a tmpfs costs a reader of RAM copies, without
// Monarch: a file of SIZE MiB is filled through a mapping (the service's
// writes), then a process maps it afresh and 2 threads copy it out in
// random 112 KiB records (an ImageNet-like file each), once as a new
// process does (every page a first touch) and three times more with the
// mapping warm (a process that keeps it). Also one pass of pread() over a
// fresh descriptor, which a forked DataLoader worker uses (RamReader).
//
//   bench_ram_pages FILE SIZE_MIB
//
// Run it on /dev/shm (4 KiB pages here) and on a tmpfs mounted
// huge=within_size, in turns (bench/results/ram_pages.md).

#include <fcntl.h>
#include <pthread.h>
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

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s FILE SIZE_MIB\n", argv[0]);
    return 2;
  }
  const size_t size = (size_t)atol(argv[2]) << 20;
  fd = open(argv[1], O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
    perror(argv[1]);
    return 1;
  }
  char* writer = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (writer == MAP_FAILED) {
    perror("mmap");
    return 1;
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
  mapped = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
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
