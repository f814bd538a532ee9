// What only UringTransport has: its options and the cancellation of receives by an exiting thread. The cases every
// UDP transport passes are in udp_transport_test.cc.
#include "wire/uring_transport.h"

#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "wire/udp_test_util.h"

namespace uroce::wire {
namespace {

class UringTransportTest : public testing::TestWithParam<bool> {};  // parameter: force single-shot receives

TEST_P(UringTransportTest, ReceivesSurviveTheArmingThreadExiting) {
  // io_uring cancels requests of a thread that exits; the next Poll re-arms them.
  UringTransport::Options o;
  o.force_fallback_receive = GetParam();
  std::unique_ptr<UringTransport> a, b;
  const int r = UringTransport::Create(kLoopbackAnyPort, o, &a);
  if (r == -ENOSYS || r == -EPERM) GTEST_SKIP() << "io_uring unavailable: " << strerror(-r);
  ASSERT_EQ(r, 0);
  ASSERT_EQ(UringTransport::Create(kLoopbackAnyPort, o, &b), 0);
  std::thread([&] { EXPECT_EQ(b->Poll([](const InDatagram&) {}, 0), 0); }).join();
  ExpectOneDatagramArrives(*a, *b, Numbered(3, 100));
  EXPECT_EQ(b->counters().receive_errors, 0u);
}

INSTANTIATE_TEST_SUITE_P(ReceivePaths, UringTransportTest, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& info) { return info.param ? "Fallback" : "Multishot"; });

TEST(UringTransportCreateTest, BadOptions) {
  std::unique_ptr<UringTransport> t;
  UringTransport::Options bad;
  bad.ring_entries = 0;
  EXPECT_EQ(UringTransport::Create(kLoopbackAnyPort, bad, &t), -EINVAL);
  bad = {};
  bad.max_datagram = 0;
  EXPECT_EQ(UringTransport::Create(kLoopbackAnyPort, bad, &t), -EINVAL);
  EXPECT_FALSE(t);
}

}  // namespace
}  // namespace uroce::wire
