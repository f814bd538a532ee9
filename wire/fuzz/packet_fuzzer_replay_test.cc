// Runs the fuzz target's entry point over the seed corpus and deterministic mutations of it, under the regular
// build (and --config=asan), so the parser's bounds are exercised in every test run, not only when fuzzing.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "wire/frame.h"
#include "wire/fuzz/replay_corpus.h"
#include "wire/icrc.h"
#include "wire/packet.h"

namespace {

using uroce::fuzzing::LoadCorpus;
using uroce::fuzzing::RunOne;

std::string CorpusDir() { return uroce::fuzzing::RunfilesDir("wire/fuzz/corpus"); }

TEST(PacketFuzzerReplay, SeedCorpusAndMutations) {
  const auto seeds = LoadCorpus(CorpusDir());
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
  const auto seeds = LoadCorpus(CorpusDir());
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
