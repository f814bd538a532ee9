// Runs the fuzz target's entry point over the seed corpus and deterministic mutations of it, under the regular
// build (and --config=asan), so the parser's bounds are exercised in every test run, not only when fuzzing.
#include <dirent.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "wire/frame.h"
#include "wire/icrc.h"
#include "wire/packet.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string CorpusDir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (workspace ? workspace : "uroce") + "/wire/fuzz/corpus";
}

struct Seed {
  std::string name;
  std::vector<uint8_t> bytes;
};

std::vector<Seed> LoadCorpus() {
  std::vector<Seed> seeds;
  const std::string dir = CorpusDir();
  DIR* d = opendir(dir.c_str());
  if (!d) return seeds;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(dir + "/" + e->d_name, std::ios::binary);
    seeds.push_back({e->d_name, {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()}});
  }
  closedir(d);
  return seeds;
}

// Each input is copied into a buffer of exactly its size so ASan catches any read past the end.
void RunOne(const std::vector<uint8_t>& input) {
  std::vector<uint8_t> exact(input);
  LLVMFuzzerTestOneInput(exact.empty() ? nullptr : exact.data(), exact.size());
}

TEST(PacketFuzzerReplay, SeedCorpusAndMutations) {
  const auto seeds = LoadCorpus();
  ASSERT_GE(seeds.size(), 80u) << "seed corpus missing at " << CorpusDir();
  std::mt19937 rng(31);
  size_t runs = 0;
  for (const auto& [name, seed] : seeds) {
    RunOne(seed);
    // Every prefix, and the UDP payload alone (IPv4 header 20 + UDP 8).
    for (size_t n = 0; n < seed.size(); n += 1 + seed.size() / 64) RunOne({seed.begin(), seed.begin() + n});
    if (seed.size() > 28) RunOne({seed.begin() + 28, seed.end()});
    // Random bit flips and byte overwrites.
    for (int i = 0; i < 64 && !seed.empty(); ++i) {
      auto m = seed;
      m[rng() % m.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      if (i & 1) m[rng() % m.size()] = static_cast<uint8_t>(rng());
      RunOne(m);
      ++runs;
    }
    runs += 66;
  }
  RunOne({});
  EXPECT_GT(runs, 5000u);
}

// The seeds are valid packets: scapy-built IPv4 frames (wire/testdata/scapy_vectors.py) and IPv6 frames whose ICRC
// was computed by hand in Python from the A17.3.3 masking rules.
TEST(PacketFuzzerReplay, SeedsAreValidPackets) {
  using namespace uroce::wire;
  const auto seeds = LoadCorpus();
  size_t v6 = 0;
  for (const auto& [name, bytes] : seeds) {
    SCOPED_TRACE(name);
    auto frame = ParseIpUdpFrame(bytes);
    ASSERT_TRUE(frame.has_value()) << ToString(frame.error());
    auto packet = ParsePacket(frame->udp_payload);
    ASSERT_TRUE(packet.has_value()) << ToString(packet.error());
    EXPECT_TRUE(VerifyIcrc(frame->flow, frame->udp_payload).ok);
    if (!frame->flow.src.addr.is_v4()) ++v6;
  }
  EXPECT_GE(v6, 4u);
}

}  // namespace
