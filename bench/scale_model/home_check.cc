// home_check: the homes the C++ code computes, for the scale model's
// equality check (bench/scale_model.py --check-hash).
//
// Reads one dataset-relative name per line on stdin and prints, per name,
// StableNameHash(name) in hex and HomeRank(hash, N) for every N given on the
// command line, tab-separated. A line "<file>\t<index>\t<extent bytes>"
// names an extent instead: the same for the extent's name, with the home
// its HolderOrder gives (striped round the peers from the file's home).
// Links the real rendezvous_hash.cc from libmonarch.a.
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
  std::string line;
  while (std::getline(std::cin, line)) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) {
      const uint64_t h = monarch::StableNameHash(line);
      std::printf("%016" PRIx64, h);
      for (int n : peers) std::printf("\t%d", monarch::HomeRank(h, n));
    } else {
      const size_t tab2 = line.find('\t', tab + 1);
      const std::string file = line.substr(0, tab);
      const std::string index = line.substr(tab + 1, tab2 - tab - 1);
      const std::string extent_bytes = line.substr(tab2 + 1);
      const std::string name = ".monarch/extents/" + extent_bytes + "/" + file + "/" + index;
      const uint64_t h = monarch::StableNameHash(name);
      std::printf("%016" PRIx64, h);
      for (int n : peers) {
        const monarch::HolderOrder order = monarch::HolderOrder::OfExtent(
            h, monarch::StableNameHash(file), static_cast<uint32_t>(std::atoll(index.c_str())), n);
        std::printf("\t%d", order.Home(n));
      }
    }
    std::printf("\n");
  }
  return 0;
}
