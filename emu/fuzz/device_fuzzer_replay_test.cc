// Runs the device fuzzer's entry point over its corpus (seeds and regression inputs) and deterministic mutations of
// it, under the regular build (and --config=asan), so the invariants the fuzzer checks hold in every test run, not
// only when fuzzing. A violated invariant traps, which fails the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "emu/fuzz/device_fuzzer.h"
#include "wire/fuzz/replay_corpus.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace uroce::emu::fuzz {
namespace {

using fuzzing::LoadCorpus;
using fuzzing::RunOne;

std::string CorpusDir() { return fuzzing::RunfilesDir("emu/fuzz/corpus"); }

// Where each record starts (after the options byte).
std::vector<size_t> RecordStarts(const std::vector<uint8_t>& input) {
  std::vector<size_t> starts;
  size_t at = 1;
  while (at + kRecordHeaderSize <= input.size()) {
    starts.push_back(at);
    at += kRecordHeaderSize + (input[at + 2] | input[at + 3] << 8);
  }
  return starts;
}

TEST(DeviceFuzzerReplay, CorpusAsIs) {
  const auto seeds = LoadCorpus(CorpusDir());
  ASSERT_GE(seeds.size(), 40u) << "corpus missing at " << CorpusDir();
  for (const auto& [name, bytes] : seeds) {
    SCOPED_TRACE(name);
    RunOne(bytes);
  }
  RunOne({});
  RunOne({kOptionHeldAcks});
}

// Every record boundary of each seed (the input cut short), and random bit flips and byte overwrites: records then
// name other targets, memories, operations and lengths.
TEST(DeviceFuzzerReplay, PrefixesAndMutations) {
  const auto seeds = LoadCorpus(CorpusDir());
  std::mt19937 rng(47);
  size_t runs = 0;
  for (const auto& [name, seed] : seeds) {
    SCOPED_TRACE(name);
    for (size_t start : RecordStarts(seed)) {
      RunOne({seed.begin(), seed.begin() + static_cast<std::ptrdiff_t>(start)});
      ++runs;
    }
    for (int i = 0; i < 12 && !seed.empty(); ++i) {
      auto m = seed;
      m[rng() % m.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      if (i & 1) m[rng() % m.size()] = static_cast<uint8_t>(rng());
      RunOne(m);
      ++runs;
    }
  }
  EXPECT_GT(runs, 500u);
}

// The generator's seeds are captures with the bench's real numbers (corpus_generator.cc): each packet record that
// names a live QP carries that QP's number, and each R_Key it asks to be patched is already the live one. When the
// bench changes, this fails: regenerate with `bazel run //emu/fuzz:corpus_generator -- $PWD/emu/fuzz/corpus`.
TEST(DeviceFuzzerReplay, SeedsCarryTheBenchsLiveNumbers) {
  const LiveNumbers n = DescribeBench();
  const uint32_t qpn_of[kTargetCount] = {0, n.rc_qpn, n.rc_on_srq_qpn, n.uc_qpn, n.ud_qpn, n.xrc_target_qpn,
                                         n.xrc_initiator_qpn, 1, 0xFFFFFF, 0};
  size_t checked = 0;
  for (const auto& [name, bytes] : LoadCorpus(CorpusDir())) {
    if (name.size() < 3 || name[2] != '_' || !std::isxdigit(name[0])) continue;  // regression inputs: any bytes
    SCOPED_TRACE(name);
    for (size_t at : RecordStarts(bytes)) {
      const uint8_t flags = bytes[at], selector = bytes[at + 1];
      if ((flags & kRecordTypeMask) != kRecordPacket) continue;
      const size_t length = std::min<size_t>(bytes[at + 2] | bytes[at + 3] << 8, bytes.size() - at - 4);
      auto p = wire::ParsePacket(std::span(bytes).subspan(at + 4, length));
      ASSERT_TRUE(p.has_value());
      const auto target = static_cast<Target>((selector & 0x0f) % kTargetCount);
      if (target != kKeepQpn && target != kUnknownQp) EXPECT_EQ(p->bth.dest_qp, qpn_of[target]);
      const auto memory = static_cast<Memory>((selector >> 4) % kMemoryCount);
      if (flags & kPatchKeys) {
        if (p->reth) EXPECT_EQ(p->reth->rkey, n.rkey[memory]);
        if (p->atomic) EXPECT_EQ(p->atomic->rkey, n.rkey[memory]);
      }
      if ((flags & kPatchSrqn) && p->xrc) EXPECT_EQ(p->xrc->srqn, n.xrc_srqn);
      ++checked;
    }
  }
  EXPECT_GT(checked, 50u);
}

}  // namespace
}  // namespace uroce::emu::fuzz
