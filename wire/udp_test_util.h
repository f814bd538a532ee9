// Helpers of the UDP transport tests (udp_transport_test, uring_transport_test, socket_transport_test,
// segmented_wire_test): numbered payloads, a bounded receive loop, a packet-socket capture of what reaches lo.
#pragma once

#include <arpa/inet.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "wire/icrc.h"
#include "wire/transport.h"

namespace uroce::wire {

inline const UdpEndpoint kLoopbackAnyPort{IpAddress::V4(0x7f000001), 0};

// A packet socket on lo (SOCK_DGRAM: frames from the IPv4 header on) that sees only UDP datagrams to `port`: the
// rest of lo's traffic (other tests run in parallel and stream gigabytes) would fill its buffer and crowd out the
// datagrams looked for. Returns the descriptor or -errno (-EPERM without CAP_NET_RAW).
inline int CaptureUdpOnLoopback(uint16_t port) {
  const int ps = socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC, htons(ETH_P_IP));
  if (ps < 0) return -errno;
  sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 9),  // IPv4 protocol
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_UDP, 0, 4),
      BPF_STMT(BPF_LDX | BPF_B | BPF_MSH, 0),  // X = IPv4 header length
      BPF_STMT(BPF_LD | BPF_H | BPF_IND, 2),   // UDP destination port
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, port, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, 0xffff),
      BPF_STMT(BPF_RET | BPF_K, 0),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
  sockaddr_ll ll{};
  ll.sll_family = AF_PACKET;
  ll.sll_protocol = htons(ETH_P_IP);
  ll.sll_ifindex = int(if_nametoindex("lo"));
  if (ll.sll_ifindex == 0 || setsockopt(ps, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) < 0 ||
      bind(ps, reinterpret_cast<sockaddr*>(&ll), sizeof ll) < 0) {
    const int e = errno != 0 ? -errno : -ENODEV;
    close(ps);
    return e;
  }
  return ps;
}

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

// Sends all of `batch`, calling Send again for what a call did not take. Returns how many were sent: fewer than
// batch.size() when a Send returned an error or took nothing.
inline size_t SendAll(Transport& t, std::span<const OutDatagram> batch) {
  size_t sent = 0;
  while (sent < batch.size()) {
    const int n = t.Send(batch.subspan(sent));
    if (n <= 0) break;
    sent += size_t(n);
  }
  return sent;
}

// RoCE-shaped packets of one UDP_SEGMENT run from `from` to `to`: `count` - 1 numbered packets of 1036 bytes and a
// shorter last one of 520, each sealed for the flow `from` says it will leave with (IPv4 ID 0).
inline std::vector<std::vector<uint8_t>> SealedRun(const Transport& from, const UdpEndpoint& to, uint32_t count) {
  std::vector<std::vector<uint8_t>> packets;
  for (uint32_t i = 0; i < count; ++i) {
    packets.push_back(Numbered(i, i + 1 < count ? 1036 : 520));
    SealIcrc(from.OutgoingFlow(to, 0), packets.back());
  }
  return packets;
}

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
