// IPv4/IPv6 + UDP framing of RoCEv2 datagrams, for pcap files and the simulated network (a UDP socket does its own
// framing). Writes headers exactly as the ICRC pseudo-header assumes them (icrc.h) and as Linux rxe sends them:
// IPv4 with DF set, ID from the flow, no options, UDP checksum 0 (RoCEv2 Annex A17.4: the ICRC protects the packet).
//
// IPv6: RFC 8200 section 8.1 forbids a zero UDP checksum over IPv6 (RFC 6935/6936 relax that only for tunnels), so
// BuildIpUdpFrame computes a real UDP checksum for IPv6. The ICRC masks the UDP checksum, so this does not change
// the ICRC, and a capture of it looks right to Wireshark. ParseIpUdpFrame never checks the UDP checksum: the ICRC
// is the integrity check that matters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "wire/expected.h"
#include "wire/transport.h"

namespace uroce::wire {

inline constexpr size_t kIpv4HeaderSize = 20;
inline constexpr size_t kIpv6HeaderSize = 40;
inline constexpr size_t kUdpHeaderSize = 8;
inline constexpr uint8_t kIpProtoUdp = 17;
inline constexpr uint16_t kRoceSourcePortMin = 0xC000;  // RoCEv2 A17.5: source port range 0xC000-0xFFFF

// UDP source port for traffic between two QPs: a hash folded into 0xC000..0xFFFF (flow entropy for ECMP).
// Symmetric -- RoceSourcePort(a, b) == RoceSourcePort(b, a) -- so both directions of a connection hash alike.
// It uses the same arithmetic as the Linux RDMA core (flow label from the product of the two QPNs, then folded to
// 14 bits), so a uroce QP picks the port a kernel driver would for the same QPN pair.
uint16_t RoceSourcePort(uint32_t qpn_a, uint32_t qpn_b);

// Bytes of an IP + UDP frame around a UDP payload of `payload` bytes.
size_t IpUdpFrameLength(bool v6, size_t payload);

// Writes IP header + UDP header + udp_payload into the front of `out`. IPv4 when both flow addresses are IPv4
// (IpAddress::is_v4), IPv6 otherwise. Returns bytes written, or 0 when `out` is too small or the payload does not
// fit the IP length field.
size_t BuildIpUdpFrame(const Flow& flow, std::span<const uint8_t> udp_payload, std::span<uint8_t> out,
                       uint8_t ttl = 64, uint8_t tos = 0);

enum class FrameError : uint8_t {
  kTruncated,          // shorter than the headers claim
  kBadVersion,         // IP version is neither 4 nor 6
  kBadHeaderLength,    // IPv4 IHL < 5
  kBadTotalLength,     // IP total / payload length larger than the data or smaller than the headers
  kBadIpChecksum,      // IPv4 header checksum wrong
  kFragment,           // IPv4 MF set or offset != 0; IPv6 fragment header
  kNotUdp,             // protocol / next header is not UDP (IPv6 extension headers are not walked)
  kBadUdpLength,       // UDP length < 8 or disagrees with the IP length
};
std::string_view ToString(FrameError error);

struct IpUdpFrame {
  Flow flow;        // addresses, ports, IPv4 ID (0 for IPv6)
  uint8_t ttl = 0;  // IPv4 TTL / IPv6 hop limit
  uint8_t tos = 0;  // IPv4 TOS / IPv6 traffic class
  uint32_t flow_label = 0;  // IPv6 only
  bool dont_fragment = false;  // IPv4 DF (the ICRC assumes it set)
  size_t ip_header_length = 0;  // 20 + options for IPv4, 40 for IPv6
  std::span<const uint8_t> udp_payload;  // exactly UDP length - 8 bytes; trailing link padding is dropped
};

// Parses an IP packet starting at the IP header (no link layer). IPv4 options are skipped per IHL. Bytes beyond
// the IP total length (Ethernet minimum-frame padding) are ignored.
Expected<IpUdpFrame, FrameError> ParseIpUdpFrame(std::span<const uint8_t> ip_packet);

}  // namespace uroce::wire
