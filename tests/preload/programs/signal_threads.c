/* Threads and signal handlers under the preload library.
 *
 *   signal_threads FILE...
 *
 * Four threads read every FILE whole, 20 times each, with read() on their
 * own descriptors, while SIGALRM fires every 100 us; its handler calls
 * read() on a pipe (a descriptor that is not the dataset's: the hooks must
 * serve it without a lock or an allocation). One more thread shares one
 * descriptor per file with the main thread's lseek/read pairs. Prints one
 * checksum per file (identical with and without the preload); exits 1 if a
 * read failed or fewer than 100 signals were handled.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

enum { kThreads = 4, kRounds = 20 };

static int g_pipe[2];
static volatile sig_atomic_t g_handled = 0;
static volatile sig_atomic_t g_handler_errors = 0;
static int g_files;
static char** g_paths;
static uint64_t g_sums[kThreads][64];
static int g_failed = 0;

static void on_alarm(int signal_number) {
  (void)signal_number;
  const int saved = errno;
  char byte = 'x';
  if (write(g_pipe[1], &byte, 1) != 1 || read(g_pipe[0], &byte, 1) != 1 || byte != 'x') {
    g_handler_errors = g_handler_errors + 1;
  }
  g_handled = g_handled + 1;
  errno = saved;
}

static uint64_t read_whole(const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    perror(path);
    __atomic_store_n(&g_failed, 1, __ATOMIC_RELAXED);
    return 0;
  }
  static __thread unsigned char buffer[65536];
  uint64_t sum = 1469598103934665603ull;
  for (;;) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      perror("read");
      __atomic_store_n(&g_failed, 1, __ATOMIC_RELAXED);
      break;
    }
    if (n == 0) break;
    for (ssize_t i = 0; i < n; ++i) sum = (sum ^ buffer[i]) * 1099511628211ull;
  }
  close(fd);
  return sum;
}

static void* reader(void* arg) {
  const int t = (int)(intptr_t)arg;
  for (int round = 0; round < kRounds; ++round) {
    for (int i = 0; i < g_files && i < 64; ++i) {
      const uint64_t sum = read_whole(g_paths[(i + t) % g_files]);
      if (round == 0) {
        g_sums[t][(i + t) % g_files] = sum;
      } else if (sum != g_sums[t][(i + t) % g_files]) {
        fprintf(stderr, "thread %d: %s read differently in round %d\n", t,
                g_paths[(i + t) % g_files], round);
        __atomic_store_n(&g_failed, 1, __ATOMIC_RELAXED);
      }
    }
  }
  return NULL;
}

/* Two threads on one descriptor: pread at fixed offsets must not move the
 * offset the other thread's read() uses. */
static int g_shared_fd;
static void* shared_preader(void* arg) {
  (void)arg;
  char byte;
  for (int i = 0; i < 20000; ++i) {
    if (pread(g_shared_fd, &byte, 1, 0) < 0 && errno != EINTR) {
      perror("pread");
      __atomic_store_n(&g_failed, 1, __ATOMIC_RELAXED);
    }
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE...\n", argv[0]);
    return 2;
  }
  g_files = argc - 1;
  g_paths = argv + 1;
  if (pipe2(g_pipe, O_CLOEXEC) != 0) return 1;
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_handler = on_alarm;
  action.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &action, NULL);
  struct itimerval timer = {{0, 100}, {0, 100}};
  setitimer(ITIMER_REAL, &timer, NULL);

  pthread_t threads[kThreads + 1];
  for (int t = 0; t < kThreads; ++t) pthread_create(&threads[t], NULL, reader, (void*)(intptr_t)t);
  g_shared_fd = open(g_paths[0], O_RDONLY | O_CLOEXEC);
  pthread_create(&threads[kThreads], NULL, shared_preader, NULL);
  uint64_t position_errors = 0;
  for (int i = 0; i < 2000; ++i) {
    char buffer[7];
    const off_t at = (off_t)(i * 7) % 4096;
    if (lseek(g_shared_fd, at, SEEK_SET) != at) ++position_errors;
    ssize_t n = read(g_shared_fd, buffer, sizeof(buffer));
    if (n >= 0 && lseek(g_shared_fd, 0, SEEK_CUR) != at + n) ++position_errors;
  }
  for (int t = 0; t <= kThreads; ++t) pthread_join(threads[t], NULL);
  struct itimerval stop = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &stop, NULL);

  for (int i = 0; i < g_files && i < 64; ++i) {
    printf("%s %016llx\n", g_paths[i], (unsigned long long)g_sums[0][i]);
  }
  printf("offset errors %llu\n", (unsigned long long)position_errors);
  if (g_handled < 100 || g_handler_errors != 0) {
    fprintf(stderr, "signals handled %d, handler errors %d\n", (int)g_handled,
            (int)g_handler_errors);
    return 1;
  }
  return g_failed;
}
