// PeerWatch's judgement of a peer that sent a request and has no announcement: gone at once when its RoCE port is
// free; looked at again while the port is held (a killed process's io_uring holds it until the kernel's deferred
// teardown has run), and gone as soon as the port is released.
#include "rdmacm/peer_watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "wire/address.h"

namespace uroce::rdmacm {
namespace {

using std::chrono::milliseconds;

// A socket holding UDP `port` on `address` (-1: taken by somebody else).
int HoldPort(const wire::IpAddress& address, uint16_t port) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  in.sin_addr.s_addr = htonl(address.v4());
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&in), sizeof in) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

// A loopback address of 127.0.0.0/8 whose RoCE port nobody holds (tests run in parallel: never a fixed one).
wire::IpAddress FreeLoopbackAddress() {
  std::random_device random;
  for (;;) {
    const wire::IpAddress a = wire::IpAddress::V4((127u << 24) | (random() & 0xfffffe) | 1);
    if (const int fd = HoldPort(a, wire::kRoceV2UdpPort); fd >= 0) {
      close(fd);
      return a;
    }
  }
}

// The peers a PeerWatch reported gone, waited for.
class GoneLog {
 public:
  void Add(const wire::IpAddress& peer) {
    std::lock_guard lock(mu_);
    gone_.push_back(peer);
    cv_.notify_all();
  }
  bool WaitFor(const wire::IpAddress& peer, milliseconds limit) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return std::count(gone_.begin(), gone_.end(), peer) > 0; });
  }
  bool Has(const wire::IpAddress& peer) {
    std::lock_guard lock(mu_);
    return std::count(gone_.begin(), gone_.end(), peer) > 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<wire::IpAddress> gone_;
};

// A PeerWatch lives as long as the process (its thread is detached), as the library's does.
PeerWatch& StartedWatch(GoneLog& log) {
  auto* watch = new PeerWatch;
  EXPECT_EQ(watch->Start(FreeLoopbackAddress(), [&log](const wire::IpAddress& p) { log.Add(p); }), 0);
  return *watch;
}

TEST(PeerWatchTest, AnUnannouncedPeerWithItsPortFreeIsGoneAtOnce) {
  GoneLog log;
  PeerWatch& watch = StartedWatch(log);
  const wire::IpAddress peer = FreeLoopbackAddress();
  watch.Watch(peer);
  EXPECT_TRUE(log.WaitFor(peer, milliseconds(5000)));
}

TEST(PeerWatchTest, APeerWhosePortIsStillHeldIsGoneWhenItIsReleased) {
  GoneLog log;
  PeerWatch& watch = StartedWatch(log);
  const wire::IpAddress peer = FreeLoopbackAddress();
  const int held = HoldPort(peer, wire::kRoceV2UdpPort);  // as a dead process's io_uring holds it for a while
  ASSERT_GE(held, 0);
  watch.Watch(peer);
  // Looked at three times meanwhile: still held, so not gone (a live device with a kernel of its own looks the same).
  std::this_thread::sleep_for(milliseconds(3 * PeerWatch::kUnsureLookNs / 1'000'000));
  EXPECT_FALSE(log.Has(peer));
  close(held);
  // The next look finds the port free: gone, long before a REP's retries would have ended the connection.
  EXPECT_TRUE(log.WaitFor(peer, milliseconds(5000)));
}

}  // namespace
}  // namespace uroce::rdmacm
