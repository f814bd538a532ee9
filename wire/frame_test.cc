#include "wire/frame.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "wire/bytes.h"

namespace uroce::wire {
namespace {

Flow V4() {
  Flow f;
  f.src = {*IpAddress::Parse("10.0.0.1"), 0xC123};
  f.dst = {*IpAddress::Parse("10.0.0.2"), kRoceV2UdpPort};
  f.ip_id = 0xBEEF;
  return f;
}
Flow V6() {
  Flow f;
  f.src = {*IpAddress::Parse("fe80::1"), 0xC456};
  f.dst = {*IpAddress::Parse("2001:db8::2"), kRoceV2UdpPort};
  return f;
}

uint16_t OnesComplementSum(const uint8_t* p, size_t n, uint32_t sum = 0) {
  for (size_t i = 0; i + 1 < n; i += 2) sum += LoadBe16(p + i);
  if (n & 1) sum += p[n - 1] << 8;
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

std::vector<uint8_t> Build(const Flow& flow, const std::vector<uint8_t>& payload, uint8_t ttl = 64,
                           uint8_t tos = 0) {
  const bool v6 = !(flow.src.addr.is_v4() && flow.dst.addr.is_v4());
  std::vector<uint8_t> out(IpUdpFrameLength(v6, payload.size()));
  EXPECT_EQ(BuildIpUdpFrame(flow, payload, out, ttl, tos), out.size());
  return out;
}

TEST(SourcePort, RangeAndSymmetry) {
  std::mt19937 rng(21);
  for (int i = 0; i < 10000; ++i) {
    uint32_t a = rng() & 0xFFFFFF, b = rng() & 0xFFFFFF;
    uint16_t p = RoceSourcePort(a, b);
    EXPECT_GE(p, 0xC000);
    EXPECT_EQ(p, RoceSourcePort(b, a));
  }
  // Values computed independently from the Linux flow-label formula.
  EXPECT_EQ(RoceSourcePort(0x11, 0x22), 0xC242);
  EXPECT_EQ(RoceSourcePort(0x123456, 0xABCDEF), 0xC3C8);
  EXPECT_EQ(RoceSourcePort(0, 5), 0xC000);
}

TEST(Frame, Ipv4Layout) {
  const std::vector<uint8_t> payload = {1, 2, 3, 4, 5, 6, 7, 8};
  auto f = Build(V4(), payload, 33, 0x02);
  ASSERT_EQ(f.size(), 20u + 8 + 8);
  EXPECT_EQ(f[0], 0x45);
  EXPECT_EQ(f[1], 0x02);
  EXPECT_EQ(LoadBe16(f.data() + 2), 36);
  EXPECT_EQ(LoadBe16(f.data() + 4), 0xBEEF);
  EXPECT_EQ(LoadBe16(f.data() + 6), 0x4000);  // DF
  EXPECT_EQ(f[8], 33);
  EXPECT_EQ(f[9], 17);
  EXPECT_EQ(OnesComplementSum(f.data(), 20), 0xFFFF);  // checksum valid
  EXPECT_EQ(LoadBe32(f.data() + 12), 0x0A000001u);
  EXPECT_EQ(LoadBe32(f.data() + 16), 0x0A000002u);
  EXPECT_EQ(LoadBe16(f.data() + 20), 0xC123);
  EXPECT_EQ(LoadBe16(f.data() + 22), 4791);
  EXPECT_EQ(LoadBe16(f.data() + 24), 16);
  EXPECT_EQ(LoadBe16(f.data() + 26), 0);  // UDP checksum 0 over IPv4
  EXPECT_EQ(std::vector<uint8_t>(f.begin() + 28, f.end()), payload);
}

TEST(Frame, Ipv6LayoutAndUdpChecksum) {
  const std::vector<uint8_t> payload = {9, 8, 7, 6, 5};
  auto f = Build(V6(), payload, 12, 0xA0);
  ASSERT_EQ(f.size(), 40u + 8 + 5);
  EXPECT_EQ(LoadBe32(f.data()), 0x6A000000u);  // version 6, traffic class 0xA0, flow label 0
  EXPECT_EQ(LoadBe16(f.data() + 4), 13);
  EXPECT_EQ(f[6], 17);
  EXPECT_EQ(f[7], 12);
  // UDP checksum over the IPv6 pseudo-header verifies (RFC 8200 8.1).
  uint32_t sum = OnesComplementSum(f.data() + 8, 32);
  sum += 13 + 17;
  EXPECT_EQ(OnesComplementSum(f.data() + 40, 13, sum), 0xFFFF);
  EXPECT_NE(LoadBe16(f.data() + 46), 0);
}

TEST(Frame, RoundTripV4AndV6) {
  std::mt19937 rng(22);
  for (const Flow& flow : {V4(), V6()}) {
    for (size_t n : {0, 1, 16, 1500}) {
      std::vector<uint8_t> payload(n);
      for (auto& b : payload) b = static_cast<uint8_t>(rng());
      auto frame = Build(flow, payload, 77, 0x0C);
      auto parsed = ParseIpUdpFrame(frame);
      ASSERT_TRUE(parsed.has_value()) << ToString(parsed.error());
      EXPECT_EQ(parsed->flow.src, flow.src);
      EXPECT_EQ(parsed->flow.dst, flow.dst);
      EXPECT_EQ(parsed->flow.ip_id, flow.src.addr.is_v4() ? flow.ip_id : 0);
      EXPECT_EQ(parsed->ttl, 77);
      EXPECT_EQ(parsed->tos, 0x0C);
      EXPECT_EQ(parsed->dont_fragment, flow.src.addr.is_v4());
      EXPECT_EQ(std::vector<uint8_t>(parsed->udp_payload.begin(), parsed->udp_payload.end()), payload);
      // Link-layer padding after the IP packet is ignored.
      frame.resize(frame.size() + 6, 0xAA);
      auto padded = ParseIpUdpFrame(frame);
      ASSERT_TRUE(padded.has_value());
      EXPECT_EQ(padded->udp_payload.size(), n);
    }
  }
}

TEST(Frame, BuildRejectsSmallBuffer) {
  std::vector<uint8_t> payload(10), out(37);
  EXPECT_EQ(BuildIpUdpFrame(V4(), payload, out), 0u);
  out.resize(38);
  EXPECT_EQ(BuildIpUdpFrame(V4(), payload, out), 38u);
  std::vector<uint8_t> huge(70000), huge_out(70100);
  EXPECT_EQ(BuildIpUdpFrame(V4(), huge, huge_out), 0u);
}

void FixChecksum(std::vector<uint8_t>& f, size_t ihl) {
  f[10] = f[11] = 0;
  StoreBe16(f.data() + 10, static_cast<uint16_t>(~OnesComplementSum(f.data(), ihl)));
}

TEST(Frame, Ipv4OptionsAreSkipped) {
  auto plain = Build(V4(), {1, 2, 3, 4});
  std::vector<uint8_t> f(plain.begin(), plain.begin() + 20);
  f.insert(f.end(), {1, 1, 1, 0});  // NOP NOP NOP EOL: 4 bytes of options
  f.insert(f.end(), plain.begin() + 20, plain.end());
  f[0] = 0x46;
  StoreBe16(f.data() + 2, static_cast<uint16_t>(f.size()));
  FixChecksum(f, 24);
  auto parsed = ParseIpUdpFrame(f);
  ASSERT_TRUE(parsed.has_value()) << ToString(parsed.error());
  EXPECT_EQ(parsed->ip_header_length, 24u);
  EXPECT_EQ(parsed->udp_payload.size(), 4u);
  EXPECT_EQ(parsed->udp_payload[0], 1);
}

TEST(Frame, ParseErrors) {
  auto expect_error = [](const std::vector<uint8_t>& f, FrameError want) {
    auto r = ParseIpUdpFrame(f);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error(), want) << ToString(r.error());
  };
  const auto good = Build(V4(), {1, 2, 3, 4});
  expect_error({}, FrameError::kTruncated);
  auto v5 = good;
  v5[0] = 0x55;
  expect_error(v5, FrameError::kBadVersion);
  auto ihl = good;
  ihl[0] = 0x44;
  expect_error(ihl, FrameError::kBadHeaderLength);
  auto total_small = good;
  StoreBe16(total_small.data() + 2, 19);
  FixChecksum(total_small, 20);
  expect_error(total_small, FrameError::kBadTotalLength);
  auto total_big = good;
  StoreBe16(total_big.data() + 2, static_cast<uint16_t>(good.size() + 1));
  FixChecksum(total_big, 20);
  expect_error(total_big, FrameError::kTruncated);
  auto checksum = good;
  checksum[8] ^= 1;  // TTL changed, checksum not
  expect_error(checksum, FrameError::kBadIpChecksum);
  auto mf = good;
  mf[6] |= 0x20;
  FixChecksum(mf, 20);
  expect_error(mf, FrameError::kFragment);
  auto offset = good;
  offset[7] = 1;
  FixChecksum(offset, 20);
  expect_error(offset, FrameError::kFragment);
  auto tcp = good;
  tcp[9] = 6;
  FixChecksum(tcp, 20);
  expect_error(tcp, FrameError::kNotUdp);
  auto udp_len = good;
  StoreBe16(udp_len.data() + 24, 11);
  expect_error(udp_len, FrameError::kBadUdpLength);
  auto no_udp = good;
  no_udp.resize(24);
  StoreBe16(no_udp.data() + 2, 24);
  FixChecksum(no_udp, 20);
  expect_error(no_udp, FrameError::kBadUdpLength);

  const auto good6 = Build(V6(), {1, 2, 3, 4});
  auto frag6 = good6;
  frag6[6] = 44;
  expect_error(frag6, FrameError::kFragment);
  auto hop6 = good6;
  hop6[6] = 0;  // hop-by-hop options: extension headers are not walked
  expect_error(hop6, FrameError::kNotUdp);
  auto len6 = good6;
  StoreBe16(len6.data() + 4, 100);
  expect_error(len6, FrameError::kTruncated);
  auto udp6 = good6;
  StoreBe16(udp6.data() + 44, 13);
  expect_error(udp6, FrameError::kBadUdpLength);
  std::vector<uint8_t> short6(good6.begin(), good6.begin() + 39);
  expect_error(short6, FrameError::kTruncated);
}

TEST(Frame, EveryPrefixFailsCleanly) {
  for (const Flow& flow : {V4(), V6()}) {
    auto f = Build(flow, {1, 2, 3, 4, 5, 6, 7, 8});
    for (size_t n = 0; n < f.size(); ++n) {
      std::vector<uint8_t> prefix(f.begin(), f.begin() + n);
      EXPECT_FALSE(ParseIpUdpFrame(prefix).has_value()) << n;
    }
  }
}

TEST(Frame, RandomBytesNeverCrash) {
  std::mt19937 rng(23);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> junk(rng() % 80);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    if (!junk.empty()) junk[0] = static_cast<uint8_t>((i & 1 ? 0x40 : 0x60) | (junk[0] & 0x0F));
    auto r = ParseIpUdpFrame(junk);
    if (r.has_value()) {
      EXPECT_LE(r->udp_payload.data() + r->udp_payload.size(), junk.data() + junk.size());
    }
  }
}

}  // namespace
}  // namespace uroce::wire
