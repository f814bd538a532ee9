// rclose of a stream rsocket whose rconnect is still in its handshake on another thread: the handshake's waits
// release the rsocket's lock (rsocket.h, "Locking"), so rclose must end them -- rconnect fails with EBADF -- before it
// frees the connection id and channel they use, and must not wait for the handshake's own timeouts.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "rdmacm/run_with_deadline.h"

namespace {

using uroce::rdmacm::testing::RunWithDeadline;

// An rdma_cm listener on an ephemeral loopback port that never fetches its events: a connection request to it is
// neither accepted nor rejected, so the caller waits for a REP.
struct SilentListener {
  rdma_event_channel* channel = nullptr;
  rdma_cm_id* id = nullptr;
  sockaddr_in address{};

  bool Start() {
    channel = rdma_create_event_channel();
    if (channel == nullptr || rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP) != 0) return false;
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&address)) != 0 || rdma_listen(id, 4) != 0) return false;
    address.sin_port = rdma_get_src_port(id);
    return true;
  }
  ~SilentListener() {
    if (id) rdma_destroy_id(id);
    if (channel) rdma_destroy_event_channel(channel);
  }
};

TEST(RsocketClose, EndsAConnectStillInItsHandshake) {
  SilentListener listener;
  ASSERT_TRUE(listener.Start()) << strerror(errno);
  const int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0) << strerror(errno);
  std::atomic<bool> started{false};
  int rc = 0, err = 0, close_rc = -1;
  std::chrono::steady_clock::duration close_took{};
  RunWithDeadline({[&] {
                     started = true;
                     rc = rconnect(fd, reinterpret_cast<const sockaddr*>(&listener.address), sizeof listener.address);
                     err = errno;
                   },
                   [&] {
                     while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                     std::this_thread::sleep_for(std::chrono::milliseconds(300));  // waiting for the REP by now
                     const auto before = std::chrono::steady_clock::now();
                     close_rc = rclose(fd);
                     close_took = std::chrono::steady_clock::now() - before;
                   }},
                  "rconnect and rclose", std::chrono::seconds(30));
  EXPECT_EQ(close_rc, 0);
  EXPECT_EQ(rc, -1);
  EXPECT_EQ(err, EBADF);
  EXPECT_LT(close_took, std::chrono::seconds(2)) << "rclose waited for the handshake's timeouts";
  errno = 0;
  EXPECT_EQ(rclose(fd), -1);
  EXPECT_EQ(errno, EBADF);
}

}  // namespace
