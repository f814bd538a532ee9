// Datagram rsockets (rsocket(3), SOCK_DGRAM over a UD QP) against the semantics of a UDP socket, in one process.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <rdma/rsocket.h>

#include <cstring>
#include <string>

#include <gtest/gtest.h>

namespace {

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// A datagram rsocket bound to an ephemeral loopback port; its port in `port`.
int BoundDatagramSocket(uint16_t* port) {
  const int fd = rsocket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return fd;
  sockaddr_in a = Loopback(0);
  socklen_t len = sizeof a;
  if (rbind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      rgetsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    rclose(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

// A loopback port that was bound a moment ago and is nobody's now.
uint16_t PortNobodyHolds() {
  uint16_t port = 0;
  const int fd = BoundDatagramSocket(&port);
  if (fd < 0) return 0;
  rclose(fd);
  return port;
}

// udpong's server answers clients that may have gone: a sendto towards a port nobody holds loses the datagram and
// returns its length, as sendto(2) on an unconnected UDP socket does, and the socket goes on working.
TEST(DatagramRsocket, ASendToAPortNobodyHoldsIsLostWithoutAnError) {
  uint16_t mine = 0;
  const int fd = BoundDatagramSocket(&mine);
  ASSERT_GE(fd, 0) << strerror(errno);
  const uint16_t gone = PortNobodyHolds();
  ASSERT_NE(gone, 0);
  const sockaddr_in to_gone = Loopback(gone);
  EXPECT_EQ(rsendto(fd, "lost", 4, 0, reinterpret_cast<const sockaddr*>(&to_gone), sizeof to_gone), 4)
      << strerror(errno);

  const sockaddr_in to_me = Loopback(mine);
  ASSERT_EQ(rsendto(fd, "kept", 4, 0, reinterpret_cast<const sockaddr*>(&to_me), sizeof to_me), 4) << strerror(errno);
  char buf[16] = {};
  sockaddr_in from{};
  socklen_t from_len = sizeof from;
  ASSERT_EQ(rrecvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &from_len), 4) << strerror(errno);
  EXPECT_EQ(std::string(buf, 4), "kept");
  EXPECT_EQ(ntohs(from.sin_port), mine);
  EXPECT_EQ(rclose(fd), 0);
}

// A connected datagram socket is told instead, as a connected UDP socket is once the ICMP port unreachable is back.
TEST(DatagramRsocket, AConnectedSocketIsRefusedByAPortNobodyHolds) {
  uint16_t mine = 0;
  const int fd = BoundDatagramSocket(&mine);
  ASSERT_GE(fd, 0) << strerror(errno);
  const uint16_t gone = PortNobodyHolds();
  ASSERT_NE(gone, 0);
  const sockaddr_in to_gone = Loopback(gone);
  ASSERT_EQ(rconnect(fd, reinterpret_cast<const sockaddr*>(&to_gone), sizeof to_gone), 0) << strerror(errno);
  errno = 0;
  EXPECT_EQ(rsend(fd, "x", 1, 0), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
  EXPECT_EQ(rclose(fd), 0);
}

}  // namespace
