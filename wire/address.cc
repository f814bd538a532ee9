#include "wire/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

namespace uroce::wire {
namespace {
constexpr uint8_t kV4MappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
}

IpAddress IpAddress::FromBytes(const uint8_t bytes[16]) {
  IpAddress a;
  std::memcpy(a.bytes_.data(), bytes, 16);
  return a;
}

IpAddress IpAddress::V4(uint32_t host_order) {
  IpAddress a;
  std::memcpy(a.bytes_.data(), kV4MappedPrefix, 12);
  a.bytes_[12] = static_cast<uint8_t>(host_order >> 24);
  a.bytes_[13] = static_cast<uint8_t>(host_order >> 16);
  a.bytes_[14] = static_cast<uint8_t>(host_order >> 8);
  a.bytes_[15] = static_cast<uint8_t>(host_order);
  return a;
}

std::optional<IpAddress> IpAddress::Parse(std::string_view text) {
  std::string s(text);
  in_addr v4{};
  if (inet_pton(AF_INET, s.c_str(), &v4) == 1) return V4(ntohl(v4.s_addr));
  in6_addr v6{};
  if (inet_pton(AF_INET6, s.c_str(), &v6) == 1) return FromBytes(v6.s6_addr);
  return std::nullopt;
}

bool IpAddress::is_loopback() const {
  static const std::array<uint8_t, 16> kV6Loopback{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return is_v4() ? (v4() >> 24) == 127 : bytes_ == kV6Loopback;
}

bool IpAddress::is_v4() const {
  // Two loads rather than a call to memcmp: asked for every packet sent and received.
  uint64_t zeros;
  uint32_t mapped;
  std::memcpy(&zeros, bytes_.data(), sizeof zeros);
  std::memcpy(&mapped, bytes_.data() + 8, sizeof mapped);
  uint32_t want;
  std::memcpy(&want, kV4MappedPrefix + 8, sizeof want);
  return zeros == 0 && mapped == want;
}

uint32_t IpAddress::v4() const {
  return (uint32_t{bytes_[12]} << 24) | (uint32_t{bytes_[13]} << 16) | (uint32_t{bytes_[14]} << 8) | bytes_[15];
}

std::string IpAddress::ToString() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (is_v4()) {
    in_addr a{htonl(v4())};
    inet_ntop(AF_INET, &a, buf, sizeof buf);
  } else {
    inet_ntop(AF_INET6, bytes_.data(), buf, sizeof buf);
  }
  return buf;
}

std::string UdpEndpoint::ToString() const {
  if (addr.is_v4()) return addr.ToString() + ":" + std::to_string(port);
  return "[" + addr.ToString() + "]:" + std::to_string(port);
}

std::optional<IpAddress> IpAddressOf(const sockaddr* sa) {
  if (sa == nullptr) return std::nullopt;
  if (sa->sa_family == AF_INET) return IpAddress::V4(ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr));
  if (sa->sa_family == AF_INET6) {
    return IpAddress::FromBytes(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr.s6_addr);
  }
  return std::nullopt;
}

}  // namespace uroce::wire
