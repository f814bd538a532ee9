#include "emu/completion_queue.h"

#include <gtest/gtest.h>

namespace uroce::emu {
namespace {

Completion C(uint64_t id, bool solicited = false, WcStatus st = WcStatus::kSuccess) {
  Completion c;
  c.wr_id = id;
  c.solicited = solicited;
  c.status = st;
  return c;
}

TEST(CompletionQueue, PollsInOrderAndRefusesWhenFull) {
  CompletionQueue cq(1, 3);
  EXPECT_EQ(cq.capacity(), 3u);
  EXPECT_TRUE(cq.Push(C(1)));
  EXPECT_TRUE(cq.Push(C(2)));
  EXPECT_TRUE(cq.Push(C(3)));
  EXPECT_FALSE(cq.Push(C(4)));
  EXPECT_TRUE(cq.overflowed());
  Completion out[8];
  ASSERT_EQ(cq.Poll(out, 2), 2);
  EXPECT_EQ(out[0].wr_id, 1u);
  EXPECT_EQ(out[1].wr_id, 2u);
  ASSERT_EQ(cq.Poll(out, 8), 1);
  EXPECT_EQ(out[0].wr_id, 3u);
  EXPECT_EQ(cq.Poll(out, 8), 0);
}

// Empty() follows every way completions come and go: Push (a refused one adds nothing), Poll, RemoveQp, Resize.
TEST(CompletionQueue, EmptyFollowsPushPollRemoveAndResize) {
  CompletionQueue cq(1, 2);
  EXPECT_TRUE(cq.Empty());
  EXPECT_TRUE(cq.Push(C(1)));
  EXPECT_FALSE(cq.Empty());
  EXPECT_TRUE(cq.Push(C(2)));
  EXPECT_FALSE(cq.Push(C(3)));
  Completion out[4];
  ASSERT_EQ(cq.Poll(out, 1), 1);
  EXPECT_FALSE(cq.Empty());
  ASSERT_EQ(cq.Poll(out, 4), 1);
  EXPECT_TRUE(cq.Empty());
  Completion other = C(4);
  other.qp_num = 9;
  EXPECT_TRUE(cq.Push(other));
  EXPECT_EQ(cq.Resize(5), 0);
  EXPECT_FALSE(cq.Empty());
  EXPECT_EQ(cq.RemoveQp(9), 1u);
  EXPECT_TRUE(cq.Empty());
  EXPECT_EQ(cq.Poll(out, 4), 0);
}

TEST(CompletionQueue, NotifiesOncePerArming) {
  CompletionQueue cq(1, 16);
  int fired = 0;
  cq.set_notifier([&](CompletionQueue&) { ++fired; });
  cq.Push(C(1));
  EXPECT_EQ(fired, 0);  // not armed
  cq.RequestNotify(false);
  cq.Push(C(2));
  cq.Push(C(3));
  EXPECT_EQ(fired, 1);
}

TEST(CompletionQueue, SolicitedOnlyWakesOnSolicitedOrError) {
  CompletionQueue cq(1, 16);
  int fired = 0;
  cq.set_notifier([&](CompletionQueue&) { ++fired; });
  cq.RequestNotify(true);
  cq.Push(C(1));
  EXPECT_EQ(fired, 0);
  cq.Push(C(2, true));
  EXPECT_EQ(fired, 1);
  cq.RequestNotify(true);
  cq.Push(C(3, false, WcStatus::kRemAccessErr));
  EXPECT_EQ(fired, 2);
}

TEST(CompletionQueue, ResizeKeepsEntriesAndRefusesBelowDepth) {
  CompletionQueue cq(1, 4);
  for (int i = 0; i < 4; ++i) cq.Push(C(i));
  Completion out[1];
  cq.Poll(out, 1);
  EXPECT_EQ(cq.Resize(2), EINVAL);
  EXPECT_EQ(cq.Resize(10), 0);
  EXPECT_EQ(cq.capacity(), 10u);
  for (int i = 1; i < 4; ++i) {
    ASSERT_EQ(cq.Poll(out, 1), 1);
    EXPECT_EQ(out[0].wr_id, uint64_t(i));
  }
}

}  // namespace
TEST(CompletionQueue, RemoveQpDropsOnlyThatQpsEntriesInOrderAcrossTheRingsEnd) {
  CompletionQueue cq(1, 4);
  Completion out[8];
  // Move head and tail near the end of the 5-slot ring so the entries wrap.
  for (uint64_t i = 0; i < 3; ++i) cq.Push(C(i));
  ASSERT_EQ(cq.Poll(out, 3), 3);
  for (uint64_t id : {10, 11, 12, 13}) {
    Completion c = C(id);
    c.qp_num = id % 2 ? 7 : 8;
    ASSERT_TRUE(cq.Push(c));
  }
  EXPECT_EQ(cq.RemoveQp(7), 2u);
  EXPECT_EQ(cq.RemoveQp(9), 0u);
  EXPECT_EQ(cq.depth(), 2u);
  ASSERT_EQ(cq.Poll(out, 8), 2);
  EXPECT_EQ(out[0].wr_id, 10u);
  EXPECT_EQ(out[1].wr_id, 12u);
  // The freed slots are usable again.
  for (uint64_t id : {20, 21, 22, 23}) EXPECT_TRUE(cq.Push(C(id)));
  EXPECT_FALSE(cq.Push(C(24)));
}

}  // namespace uroce::emu
