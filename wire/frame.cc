#include "wire/frame.h"

#include <cstring>

#include "wire/bytes.h"

namespace uroce::wire {
namespace {

bool IsV4Flow(const Flow& flow) { return flow.src.addr.is_v4() && flow.dst.addr.is_v4(); }

// RFC 1071 ones' complement sum of 16-bit big-endian words, not yet complemented.
uint32_t OnesSum(uint32_t sum, const uint8_t* p, size_t len) {
  while (len >= 2) {
    sum += LoadBe16(p);
    p += 2;
    len -= 2;
  }
  if (len) sum += static_cast<uint32_t>(p[0]) << 8;
  return sum;
}
uint16_t FoldSum(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

}  // namespace

uint16_t RoceSourcePort(uint32_t qpn_a, uint32_t qpn_b) {
  // A 20-bit flow label from the product of the 24-bit QPNs (symmetric), high bits mixed down; then its top 6 bits
  // folded into the low 14, which become the port's low bits above 0xC000. Same arithmetic as the Linux RDMA core's
  // flow-label-to-UDP-source-port mapping.
  uint64_t v = static_cast<uint64_t>(qpn_a & 0xFFFFFF) * (qpn_b & 0xFFFFFF);
  v ^= v >> 20;
  v ^= v >> 40;
  const uint32_t label = static_cast<uint32_t>(v) & 0xFFFFF;
  const uint32_t low = (label & 0x3FFF) ^ ((label & 0xFC000) >> 14);
  return static_cast<uint16_t>(kRoceSourcePortMin | low);
}

size_t IpUdpFrameLength(bool v6, size_t payload) {
  return (v6 ? kIpv6HeaderSize : kIpv4HeaderSize) + kUdpHeaderSize + payload;
}

size_t BuildIpUdpFrame(const Flow& flow, std::span<const uint8_t> udp_payload, std::span<uint8_t> out, uint8_t ttl,
                       uint8_t tos) {
  const bool v4 = IsV4Flow(flow);
  const size_t total = IpUdpFrameLength(!v4, udp_payload.size());
  const size_t udp_length = kUdpHeaderSize + udp_payload.size();
  if (out.size() < total) return 0;
  if ((v4 ? total : udp_length) > 0xFFFF) return 0;

  uint8_t* p = out.data();
  size_t ip_len;
  if (v4) {
    p[0] = 0x45;
    p[1] = tos;
    StoreBe16(p + 2, static_cast<uint16_t>(total));
    StoreBe16(p + 4, flow.ip_id);
    StoreBe16(p + 6, 0x4000);  // DF: RoCEv2 must not be fragmented; the ICRC pseudo-header assumes DF
    p[8] = ttl;
    p[9] = kIpProtoUdp;
    p[10] = p[11] = 0;
    std::memcpy(p + 12, flow.src.addr.bytes().data() + 12, 4);
    std::memcpy(p + 16, flow.dst.addr.bytes().data() + 12, 4);
    StoreBe16(p + 10, static_cast<uint16_t>(~FoldSum(OnesSum(0, p, kIpv4HeaderSize))));
    ip_len = kIpv4HeaderSize;
  } else {
    StoreBe32(p, 0x60000000u | (static_cast<uint32_t>(tos) << 20));  // version 6, traffic class, flow label 0
    StoreBe16(p + 4, static_cast<uint16_t>(udp_length));
    p[6] = kIpProtoUdp;
    p[7] = ttl;
    std::memcpy(p + 8, flow.src.addr.bytes().data(), 16);
    std::memcpy(p + 24, flow.dst.addr.bytes().data(), 16);
    ip_len = kIpv6HeaderSize;
  }
  uint8_t* udp = p + ip_len;
  StoreBe16(udp, flow.src.port);
  StoreBe16(udp + 2, flow.dst.port);
  StoreBe16(udp + 4, static_cast<uint16_t>(udp_length));
  udp[6] = udp[7] = 0;
  if (!udp_payload.empty()) std::memcpy(udp + kUdpHeaderSize, udp_payload.data(), udp_payload.size());
  if (!v4) {
    // RFC 8200 8.1: the UDP checksum over IPv6 is mandatory. Pseudo-header: addresses, upper-layer length, next
    // header; a computed 0 is sent as 0xFFFF (RFC 768).
    uint32_t sum = OnesSum(0, p + 8, 32);
    sum += static_cast<uint32_t>(udp_length >> 16) + static_cast<uint32_t>(udp_length & 0xFFFF);
    sum += kIpProtoUdp;
    sum = OnesSum(sum, udp, udp_length);
    uint16_t check = static_cast<uint16_t>(~FoldSum(sum));
    StoreBe16(udp + 6, check == 0 ? 0xFFFF : check);
  }
  return total;
}

std::string_view ToString(FrameError error) {
  switch (error) {
    case FrameError::kTruncated: return "truncated";
    case FrameError::kBadVersion: return "bad IP version";
    case FrameError::kBadHeaderLength: return "bad IP header length";
    case FrameError::kBadTotalLength: return "bad IP total length";
    case FrameError::kBadIpChecksum: return "bad IPv4 header checksum";
    case FrameError::kFragment: return "IP fragment";
    case FrameError::kNotUdp: return "not UDP";
    case FrameError::kBadUdpLength: return "bad UDP length";
  }
  return "?";
}

Expected<IpUdpFrame, FrameError> ParseIpUdpFrame(std::span<const uint8_t> ip_packet) {
  if (ip_packet.empty()) return Unexpected(FrameError::kTruncated);
  const uint8_t* p = ip_packet.data();
  const size_t size = ip_packet.size();
  IpUdpFrame f;
  size_t ip_total;
  const uint8_t version = p[0] >> 4;
  if (version == 4) {
    if (size < kIpv4HeaderSize) return Unexpected(FrameError::kTruncated);
    const size_t ihl = (p[0] & 0x0F) * 4u;
    if (ihl < kIpv4HeaderSize) return Unexpected(FrameError::kBadHeaderLength);
    if (size < ihl) return Unexpected(FrameError::kTruncated);
    ip_total = LoadBe16(p + 2);
    if (ip_total < ihl) return Unexpected(FrameError::kBadTotalLength);
    if (ip_total > size) return Unexpected(FrameError::kTruncated);
    if (FoldSum(OnesSum(0, p, ihl)) != 0xFFFF) return Unexpected(FrameError::kBadIpChecksum);
    const uint16_t frag = LoadBe16(p + 6);
    if (frag & 0x3FFF) return Unexpected(FrameError::kFragment);  // MF or a non-zero offset
    if (p[9] != kIpProtoUdp) return Unexpected(FrameError::kNotUdp);
    f.tos = p[1];
    f.ttl = p[8];
    f.dont_fragment = frag & 0x4000;
    f.flow.ip_id = LoadBe16(p + 4);
    f.flow.src.addr = IpAddress::V4(LoadBe32(p + 12));
    f.flow.dst.addr = IpAddress::V4(LoadBe32(p + 16));
    f.ip_header_length = ihl;
  } else if (version == 6) {
    if (size < kIpv6HeaderSize) return Unexpected(FrameError::kTruncated);
    ip_total = kIpv6HeaderSize + LoadBe16(p + 4);
    if (ip_total > size) return Unexpected(FrameError::kTruncated);
    constexpr uint8_t kIpv6Fragment = 44;
    if (p[6] == kIpv6Fragment) return Unexpected(FrameError::kFragment);
    if (p[6] != kIpProtoUdp) return Unexpected(FrameError::kNotUdp);
    const uint32_t word0 = LoadBe32(p);
    f.tos = static_cast<uint8_t>(word0 >> 20);
    f.flow_label = word0 & 0xFFFFF;
    f.ttl = p[7];
    f.flow.ip_id = 0;
    f.flow.src.addr = IpAddress::FromBytes(p + 8);
    f.flow.dst.addr = IpAddress::FromBytes(p + 24);
    f.ip_header_length = kIpv6HeaderSize;
  } else {
    return Unexpected(FrameError::kBadVersion);
  }

  const size_t ip_payload = ip_total - f.ip_header_length;
  if (ip_payload < kUdpHeaderSize) return Unexpected(FrameError::kBadUdpLength);
  const uint8_t* udp = p + f.ip_header_length;
  const size_t udp_length = LoadBe16(udp + 4);
  if (udp_length != ip_payload) return Unexpected(FrameError::kBadUdpLength);
  f.flow.src.port = LoadBe16(udp);
  f.flow.dst.port = LoadBe16(udp + 2);
  f.udp_payload = ip_packet.subspan(f.ip_header_length + kUdpHeaderSize, udp_length - kUdpHeaderSize);
  return f;
}

}  // namespace uroce::wire
