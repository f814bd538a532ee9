// Network addresses as RoCEv2 sees them. An IPv4 address is held in its IPv4-mapped IPv6 form (::ffff:a.b.c.d),
// which is also the RoCEv2 GID of that address (IBTA Annex A17, RoCEv2 GID = IPv6 or IPv4-mapped address), so a GID
// and an IpAddress convert without loss.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

struct sockaddr;

namespace uroce::wire {

inline constexpr uint16_t kRoceV2UdpPort = 4791;  // IANA-assigned RoCEv2 destination port.

class IpAddress {
 public:
  IpAddress() = default;
  // From a 16-byte GID / IPv6 address in network byte order.
  static IpAddress FromBytes(const uint8_t bytes[16]);
  // From an IPv4 address in host byte order (127.0.0.1 == 0x7f000001).
  static IpAddress V4(uint32_t host_order);
  // Parses dotted IPv4 or textual IPv6; nullopt if neither.
  static std::optional<IpAddress> Parse(std::string_view text);

  bool is_v4() const;
  uint32_t v4() const;  // host byte order; only meaningful when is_v4().
  // The wildcard a socket binds to receive on every local address: 0.0.0.0 or ::.
  bool is_unspecified() const { return *this == IpAddress() || *this == V4(0); }
  // The host's own loopback: 127.0.0.0/8 (RFC 1122 3.2.1.3) or ::1.
  bool is_loopback() const;
  const std::array<uint8_t, 16>& bytes() const { return bytes_; }
  std::string ToString() const;  // "127.0.0.1" or "fe80::1"

  auto operator<=>(const IpAddress&) const = default;

 private:
  std::array<uint8_t, 16> bytes_{};
};

struct UdpEndpoint {
  IpAddress addr;
  uint16_t port = kRoceV2UdpPort;

  std::string ToString() const;  // "127.0.0.1:4791", "[::1]:4791"
  auto operator<=>(const UdpEndpoint&) const = default;
};

// The IP address of an AF_INET / AF_INET6 socket address (the family says which structure it is); nullopt for a
// null pointer or another family.
std::optional<IpAddress> IpAddressOf(const sockaddr* sa);

}  // namespace uroce::wire
