/* Reads one file through the installed libmonarch_c, from C. */
#include <stdio.h>

#include "monarch/monarch_c.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  monarch_t* m = NULL;
  char* error = NULL;
  if (monarch_open_default(argv[1], &m, &error) != MONARCH_OK) {
    fprintf(stderr, "%s\n", error);
    monarch_free(error);
    return 3;
  }
  char buffer[64] = {0};
  size_t got = 0;
  if (monarch_read(m, argv[2], buffer, sizeof(buffer) - 1, 0, &got, NULL) != MONARCH_OK) return 4;
  monarch_close(m);
  printf("%s", buffer);
  return 0;
}
