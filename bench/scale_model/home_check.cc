// home_check: the homes the C++ code computes, for the scale model's
// equality check (bench/scale_model.py --check-hash).
//
// Reads one dataset-relative name per line on stdin and prints, per name,
// StableNameHash(name) in hex and HomeRank(hash, N) for every N given on the
// command line, tab-separated. Links the real rendezvous_hash.cc from
// libmonarch.a.
//
// usage: home_check N... < names

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "remote/rendezvous_hash.h"

int main(int argc, char** argv) {
  std::vector<int> peers;
  for (int i = 1; i < argc; ++i) peers.push_back(std::atoi(argv[i]));
  std::string name;
  while (std::getline(std::cin, name)) {
    const uint64_t h = monarch::StableNameHash(name);
    std::printf("%016" PRIx64, h);
    for (int n : peers) std::printf("\t%d", monarch::HomeRank(h, n));
    std::printf("\n");
  }
  return 0;
}
