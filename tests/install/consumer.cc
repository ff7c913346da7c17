// Reads one file through an installed Monarch: proves the package's headers,
// library and dependencies are complete.
#include <cstdio>
#include <cstring>

#include "monarch/monarch.h"
#include "monarch/monarch_c.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  auto m = monarch::Monarch::Create(monarch::DefaultConfig(argv[1]));
  if (!m.ok()) return 3;
  char buffer[64] = {};
  auto n = (*m)->Read(argv[2], buffer, sizeof(buffer) - 1, 0);
  if (!n.ok()) return 4;
  monarch_t* c = nullptr;
  if (monarch_open_default(argv[1], &c, nullptr) != MONARCH_OK) return 5;
  size_t got = 0;
  char again[64] = {};
  if (monarch_read(c, argv[2], again, sizeof(again) - 1, 0, &got, nullptr) != MONARCH_OK) return 6;
  monarch_close(c);
  std::printf("%s", buffer);
  return got == *n && std::memcmp(buffer, again, got) == 0 ? 0 : 7;
}
