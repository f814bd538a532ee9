#include "wire/address.h"

#include <gtest/gtest.h>

namespace uroce::wire {
namespace {

TEST(IpAddress, V4IsStoredIpv4Mapped) {
  IpAddress a = IpAddress::V4(0x7f000002);
  EXPECT_TRUE(a.is_v4());
  EXPECT_EQ(a.v4(), 0x7f000002u);
  EXPECT_EQ(a.ToString(), "127.0.0.2");
  const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2};
  EXPECT_EQ(IpAddress::FromBytes(gid), a);
}

TEST(IpAddress, ParsesBothFamiliesAndRejectsGarbage) {
  auto v4 = IpAddress::Parse("10.1.2.3");
  ASSERT_TRUE(v4.has_value());
  EXPECT_EQ(v4->v4(), 0x0a010203u);
  auto v6 = IpAddress::Parse("::1");
  ASSERT_TRUE(v6.has_value());
  EXPECT_FALSE(v6->is_v4());
  EXPECT_EQ(v6->ToString(), "::1");
  EXPECT_FALSE(IpAddress::Parse("127.0.0.256").has_value());
  EXPECT_FALSE(IpAddress::Parse("hello").has_value());
}

// The host's own loopback, as rdma_cm and the host device's address choice ask it: 127.0.0.0/8 and ::1 only.
TEST(IpAddress, LoopbackIs127Slash8AndColonColon1) {
  for (const char* yes : {"127.0.0.1", "127.255.3.4", "::1"}) EXPECT_TRUE(IpAddress::Parse(yes)->is_loopback()) << yes;
  for (const char* no : {"128.0.0.1", "10.0.0.1", "0.0.0.0", "::", "::2", "::ffff:10.0.0.1", "fe80::1"}) {
    EXPECT_FALSE(IpAddress::Parse(no)->is_loopback()) << no;
  }
}

TEST(UdpEndpoint, FormatsWithBracketsForV6) {
  EXPECT_EQ((UdpEndpoint{IpAddress::V4(0x7f000001), 4791}).ToString(), "127.0.0.1:4791");
  EXPECT_EQ((UdpEndpoint{*IpAddress::Parse("::1"), 4791}).ToString(), "[::1]:4791");
}

}  // namespace
}  // namespace uroce::wire
