// PollPattern on synthetic poll timelines: the patterns of ib_send_lat (engage, and stay engaged through a
// preemption), ib_write_lat (never hold the receive side for long), and a program that polls once and sleeps.
#include "verbs_api/poll_pattern.h"

#include <gtest/gtest.h>

namespace uroce::verbs {
namespace {

constexpr uint64_t kUs = 1000;

// One round of a ping-pong seen from one process: a completion at `t`, then empty polls every `gap` from `t + think`
// until `t + think + wait`. Returns whether the last empty poll of the round engaged, and moves `t` past the round.
bool Round(PollPattern& p, uint64_t& t, uint64_t think, uint64_t wait, uint64_t gap = 200) {
  p.OnCompletion(t);
  bool engaged = false;
  for (uint64_t at = t + think; at <= t + think + wait; at += gap) {
    engaged = p.OnEmptyPoll(at);
    p.OnReceiveSide(engaged);  // the progress thread hands the receive side over at once
  }
  t += think + wait + gap;
  return engaged;
}

TEST(PollPatternTest, ASpinningPingPongEngagesAfterTheStreak) {
  PollPattern p;
  uint64_t t = 1'000'000 * kUs;
  EXPECT_FALSE(p.OnEmptyPoll(t));
  EXPECT_FALSE(p.OnEmptyPoll(t + PollPattern::kEngageNs - 1));
  EXPECT_TRUE(p.OnEmptyPoll(t + PollPattern::kEngageNs));
  t += PollPattern::kEngageNs + 1000;
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(Round(p, t, 1 * kUs, 5 * kUs)) << "round " << i;
  EXPECT_LT(p.think_ns(), 2 * kUs);
}

TEST(PollPatternTest, OnePreemptionDoesNotDisengageAPingPong) {
  PollPattern p;
  uint64_t t = 1'000'000 * kUs;
  for (int i = 0; i < 50; ++i) Round(p, t, 1 * kUs, 5 * kUs);
  // Preempted between the completion and the next poll by a thread that ran for 45 us (a longer loss is a gap in the
  // streak of empty polls: OnAnOrdinaryMachineALongGapStartsTheStreakAgain, and on an emulated machine
  // OnAnEmulatedMachineAThreadHoldingTheReceiveSideKeepsItThroughOneLongGapNowAndThen).
  EXPECT_TRUE(Round(p, t, 45 * kUs, 5 * kUs));
  EXPECT_LT(p.think_ns(), PollPattern::kThinkNs);
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(Round(p, t, 1 * kUs, 5 * kUs));
}

TEST(PollPatternTest, OnAnEmulatedMachineAThreadHoldingTheReceiveSideKeepsItThroughOneLongGapNowAndThen) {
  PollPattern p;
  const double scale = PollPattern::kEmulatedScale;
  p.SetTimeScale(scale);
  const auto scaled = [scale](uint64_t ns) { return uint64_t(double(ns) * scale); };
  uint64_t t = 1'000'000 * kUs;
  for (int i = 0; i < 100; ++i) Round(p, t, 1 * kUs, 5 * kUs);
  ASSERT_TRUE(Round(p, t, 1 * kUs, 5 * kUs));
  // Preempted for three streak gaps in the middle of its polling: still engaged at its next poll.
  t += 3 * scaled(PollPattern::kStreakGapNs);
  EXPECT_TRUE(p.OnEmptyPoll(t));
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(Round(p, t, 1 * kUs, 5 * kUs));
  // A second long gap soon after is a program that polls rarely now: the streak starts again.
  t += 3 * scaled(PollPattern::kStreakGapNs);
  EXPECT_FALSE(p.OnEmptyPoll(t));
  EXPECT_FALSE(Round(p, t, 1 * kUs, scaled(PollPattern::kEngageNs) / 2));
  EXPECT_TRUE(Round(p, t, 1 * kUs, scaled(PollPattern::kEngageNs)));
  // Long after the last forgiven gap, another is forgiven.
  for (uint64_t end = t + scaled(PollPattern::kForgiveGapEveryNs); t < end;) ASSERT_TRUE(Round(p, t, 1 * kUs, 5 * kUs));
  t += 3 * scaled(PollPattern::kStreakGapNs);
  EXPECT_TRUE(p.OnEmptyPoll(t));
}

TEST(PollPatternTest, OnAnOrdinaryMachineALongGapStartsTheStreakAgain) {
  PollPattern p;
  uint64_t t = 1'000'000 * kUs;
  for (int i = 0; i < 50; ++i) Round(p, t, 1 * kUs, 5 * kUs);
  ASSERT_TRUE(Round(p, t, 1 * kUs, 5 * kUs));
  t += 3 * PollPattern::kStreakGapNs;
  EXPECT_FALSE(p.OnEmptyPoll(t));
  EXPECT_TRUE(Round(p, t, 1 * kUs, PollPattern::kEngageNs));
}

TEST(PollPatternTest, AProgramThatWaitsElsewhereAfterEachCompletionDisengagesAndProbesRarely) {
  PollPattern p;
  uint64_t t = 1'000'000 * kUs;
  // ib_write_lat: polls its send CQ (a completion, then an empty poll only after ~40 us spinning on memory).
  int engaged = 0;
  const int rounds = 10000;  // 10000 x ~45 us = 450 ms: four probe periods
  for (int i = 0; i < rounds; ++i) engaged += Round(p, t, 40 * kUs, 5 * kUs);
  EXPECT_GE(p.think_ns(), PollPattern::kThinkNs);
  // Engaged for the six rounds that lift the think time from 0 past kThinkNs, then for one round per probe.
  EXPECT_GE(engaged, 6);
  EXPECT_LE(engaged, 6 + 5);
}

TEST(PollPatternTest, OnAMachineThirtyTimesSlowerThePingPongOfThatMachineStillEngages) {
  // Under QEMU's TCG everything takes ~30 times as long: a ping-pong's 1 us think time is 30 us, its 5 us wait 150.
  PollPattern slow;
  slow.SetTimeScale(30);
  PollPattern unscaled;
  uint64_t t = 1'000'000 * kUs, u = t;
  int engaged = 0, engaged_unscaled = 0;
  for (int i = 0; i < 200; ++i) {
    engaged += Round(slow, t, 30 * kUs, 150 * kUs, 6 * kUs);
    engaged_unscaled += Round(unscaled, u, 30 * kUs, 150 * kUs, 6 * kUs);
  }
  EXPECT_GE(engaged, 195);
  EXPECT_LT(slow.think_ns(), 30 * PollPattern::kThinkNs);
  EXPECT_LE(engaged_unscaled, 10) << "with the thresholds of an ordinary machine it would not";
}

TEST(PollPatternTest, ThinkTimesAreSampledOnlyWhileEngagedAndAProbeTriesAgain) {
  PollPattern p;
  uint64_t t = 1'000'000 * kUs;
  for (int i = 0; i < 10; ++i) Round(p, t, 30 * kUs, 5 * kUs);  // long thinks: disengaged
  EXPECT_FALSE(Round(p, t, 30 * kUs, 5 * kUs));
  const uint64_t think = p.think_ns();
  // Short think times seen while the progress thread receives (ib_write_lat's: one wake-up delivered the ACK and the
  // peer's WRITE together) change nothing until the next probe ...
  const uint64_t probe = t + PollPattern::kProbeEveryNs - 1000 * kUs;
  while (t < probe) EXPECT_FALSE(Round(p, t, 1 * kUs, 5 * kUs));
  EXPECT_EQ(p.think_ns(), think);
  // ... which engages, and the short think times then keep the process engaged.
  bool engaged = false;
  for (uint64_t end = t + 1100 * kUs; t < end;) engaged = Round(p, t, 1 * kUs, 5 * kUs);
  EXPECT_TRUE(engaged);
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(Round(p, t, 1 * kUs, 5 * kUs));
}

TEST(PollPatternTest, ThinkTimesBeforeTheReceiveSideIsHeldAreNotSampled) {
  PollPattern p;
  uint64_t t = 1'000'000 * kUs;
  for (int i = 0; i < 10; ++i) Round(p, t, 30 * kUs, 5 * kUs);  // long thinks: disengaged
  // Polling on with long thinks until a probe engages ...
  int polls = 0;
  for (bool engaged = false; !engaged; t += 31 * kUs, ++polls) {
    p.OnCompletion(t);
    engaged = p.OnEmptyPoll(t + 30 * kUs);
    p.OnReceiveSide(false);
  }
  EXPECT_GT(uint64_t(polls) * 31 * kUs, PollPattern::kProbeEveryNs / 2);
  // ... whose handover takes a while, the progress thread sharing the CPU: the long thinks meanwhile (polls that
  // engaged without holding the receive side) do not end the probe.
  const uint64_t think = p.think_ns();
  for (int i = 0; i < 10; ++i, t += 31 * kUs) {
    p.OnCompletion(t);
    EXPECT_TRUE(p.OnEmptyPoll(t + 30 * kUs)) << "poll " << i;
    p.OnReceiveSide(false);
  }
  EXPECT_EQ(p.think_ns(), think);
  // Once it holds the receive side, short thinks keep it engaged.
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(Round(p, t, 1 * kUs, 5 * kUs)) << "round " << i;
  EXPECT_LT(p.think_ns(), PollPattern::kThinkNs);
}

TEST(PollPatternTest, SleepingOrPollingRarelyNeverEngages) {
  PollPattern p;
  uint64_t t = 1'000'000 * kUs;
  for (int i = 0; i < 100; ++i, t += PollPattern::kStreakGapNs + 1) EXPECT_FALSE(p.OnEmptyPoll(t));
  PollPattern q;
  EXPECT_FALSE(q.OnEmptyPoll(t));
  EXPECT_TRUE(q.OnEmptyPoll(t + PollPattern::kEngageNs));
  q.OnSleep(t + PollPattern::kEngageNs + 1);  // ibv_req_notify_cq: the streak starts again
  EXPECT_FALSE(q.OnEmptyPoll(t + PollPattern::kEngageNs + 2));
}

}  // namespace
}  // namespace uroce::verbs
