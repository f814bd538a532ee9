// Helpers of the UDP transport tests (udp_transport_test, uring_transport_test, socket_transport_test): numbered
// payloads and a bounded receive loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "wire/transport.h"

namespace uroce::wire {

inline const UdpEndpoint kLoopbackAnyPort{IpAddress::V4(0x7f000001), 0};

inline std::vector<uint8_t> Numbered(uint32_t n, size_t size) {
  std::vector<uint8_t> p(size);
  for (size_t i = 0; i < size; ++i) p[i] = uint8_t(n + i * 31);
  if (size >= 4) std::memcpy(p.data(), &n, 4);
  return p;
}

inline uint32_t NumberOf(std::span<const uint8_t> p) {
  uint32_t n = 0;
  if (p.size() >= 4) std::memcpy(&n, p.data(), 4);
  return n;
}

struct Received {
  UdpEndpoint src, dst;
  std::vector<uint8_t> payload;
  std::optional<uint16_t> ip_id;
};

// Polls until `count` datagrams arrived or 10 s passed.
inline std::vector<Received> ReceiveN(Transport& t, size_t count) {
  std::vector<Received> got;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got.size() < count && std::chrono::steady_clock::now() < give_up) {
    const int n = t.Poll(
        [&](const InDatagram& in) { got.push_back({in.src, in.dst, {in.payload.begin(), in.payload.end()}, in.ip_id}); },
        100'000'000);
    EXPECT_GE(n, 0);
    if (n < 0) break;
  }
  return got;
}

// Sends `payload` from `from` to `to` (asking for UDP source port `src_port`) and expects it to arrive intact, from
// `from`'s bound endpoint (a socket sends from its bound port) to `to`'s, without an IPv4 ID (a socket does not see
// the IP header).
inline void ExpectOneDatagramArrives(Transport& from, Transport& to, const std::vector<uint8_t>& payload,
                                     uint16_t src_port = 0) {
  OutDatagram dg{to.local(), src_port, payload};
  ASSERT_EQ(from.Send({&dg, 1}), 1);
  auto got = ReceiveN(to, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, payload);
  EXPECT_EQ(got[0].src, from.local());
  EXPECT_EQ(got[0].dst, to.local());
  EXPECT_FALSE(got[0].ip_id);
}

}  // namespace uroce::wire
