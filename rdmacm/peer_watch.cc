#include "rdmacm/peer_watch.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "rdmacm/abstract_names.h"
#include "wire/clock.h"
#include "wire/event_fd.h"
#include "wire/unix_socket.h"

namespace uroce::rdmacm {
namespace {

std::string PrefixOf(const wire::IpAddress& device) { return "uroce/cm/v1/device/" + device.ToString() + "/"; }

// A connected socket to the announcement `name` if its holder is a trusted user (SO_PEERCRED: the user that listened);
// -1 otherwise.
int ConnectTrusted(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_un sun;
  const socklen_t len = wire::AbstractUnixAddress(name, &sun);
  ucred holder{};
  socklen_t holder_len = sizeof holder;
  // ECONNREFUSED: gone since it was listed; EAGAIN: its queue is full. Either way not watched.
  if (connect(fd, reinterpret_cast<sockaddr*>(&sun), len) != 0 ||
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &holder, &holder_len) != 0 || !TrustedUser(holder.uid)) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whose the RoCE port of `peer` is on this host, asked of the kernel by binding it for a moment.
enum class RocePort { kFree, kHeld, kNotLocal };
RocePort RocePortOf(const wire::IpAddress& peer) {
  sockaddr_storage sa{};
  socklen_t len;
  if (peer.is_v4()) {
    auto* in = reinterpret_cast<sockaddr_in*>(&sa);
    in->sin_family = AF_INET;
    in->sin_port = htons(wire::kRoceV2UdpPort);
    in->sin_addr.s_addr = htonl(peer.v4());
    len = sizeof *in;
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&sa);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(wire::kRoceV2UdpPort);
    std::memcpy(&in6->sin6_addr, peer.bytes().data(), 16);
    len = sizeof *in6;
  }
  const int fd = socket(sa.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return RocePort::kNotLocal;
  const int rc = bind(fd, reinterpret_cast<sockaddr*>(&sa), len);
  const int err = errno;
  close(fd);
  if (rc == 0) return RocePort::kFree;
  return err == EADDRINUSE ? RocePort::kHeld : RocePort::kNotLocal;  // EADDRNOTAVAIL: not an address of ours
}

}  // namespace

int PeerWatch::Start(const wire::IpAddress& self, std::function<void(const wire::IpAddress&)> on_gone) {
  self_ = self;
  on_gone_ = std::move(on_gone);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return errno;
  thread_ = std::thread([this] { Run(); });
  thread_.detach();  // lives as long as the process: the library is never unloaded
  announce_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (announce_fd_ < 0) return errno;
  std::random_device random;
  char suffix[20];
  std::snprintf(suffix, sizeof suffix, "%08x%08x", random(), random());
  sockaddr_un sun;
  const socklen_t len = wire::AbstractUnixAddress(PrefixOf(self) + suffix, &sun);
  // Watchers connect and are never accepted: the backlog only bounds how many may wait in the queue.
  if (bind(announce_fd_, reinterpret_cast<sockaddr*>(&sun), len) != 0 || listen(announce_fd_, SOMAXCONN) != 0) {
    const int err = errno;
    close(announce_fd_);
    announce_fd_ = -1;
    return err;
  }
  return 0;
}

PeerWatch::Seen PeerWatch::LookLocked(const wire::IpAddress& peer) {
  const std::vector<AbstractName> names = AbstractNamesWithPrefix(PrefixOf(peer));
  for (const AbstractName& n : names) {
    if (!Trusted(n)) continue;
    if (const int fd = ConnectTrusted(n.name); fd >= 0) {
      watched_[peer] = fd;
      return Seen::kAnnounced;
    }
  }
  // No announcement left, or one that refused the connection (its process died between the listing and the connect,
  // or while it was listed): with its RoCE port free, the device is gone. A stranger's name cannot make a live device
  // look so: a live device holds its port.
  switch (RocePortOf(peer)) {
    case RocePort::kFree: return Seen::kGone;
    // A device that has just died and whose port its io_uring still holds, or a device with a kernel of its own (or
    // a stranger's name): only waiting tells them apart.
    case RocePort::kHeld: return Seen::kHeld;
    case RocePort::kNotLocal: break;
  }
  return Seen::kForeign;  // not on this host: its own kernel speaks for it
}

void PeerWatch::Watch(const wire::IpAddress& peer) {
  if (peer == self_ || wake_fd_ < 0) return;
  std::lock_guard lock(mu_);
  if (watched_.count(peer) || unsure_.count(peer)) return;
  switch (LookLocked(peer)) {
    case Seen::kAnnounced: break;
    case Seen::kGone: found_dead_.push_back(peer); break;
    case Seen::kHeld: unsure_[peer] = wire::SystemClock::Instance().NowNs() + kUnsureForNs; break;
    case Seen::kForeign: return;
  }
  wire::SignalEventFd(wake_fd_);
}

void PeerWatch::LookAtUnsure() {
  std::lock_guard lock(mu_);
  const uint64_t now = wire::SystemClock::Instance().NowNs();
  for (auto it = unsure_.begin(); it != unsure_.end();) {
    const Seen seen = LookLocked(it->first);
    if (seen == Seen::kGone) found_dead_.push_back(it->first);
    if (seen != Seen::kHeld || now >= it->second) {
      it = unsure_.erase(it);  // watched, gone, or given up on: a device of its own
    } else {
      ++it;
    }
  }
}

void PeerWatch::Run() {
  for (;;) {
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
    std::vector<wire::IpAddress> peers{wire::IpAddress()};
    std::vector<wire::IpAddress> dead;
    bool unsure;
    {
      std::lock_guard lock(mu_);
      dead.swap(found_dead_);
      for (const auto& [peer, fd] : watched_) {
        fds.push_back({fd, POLLRDHUP, 0});
        peers.push_back(peer);
      }
      unsure = !unsure_.empty();
    }
    for (const wire::IpAddress& peer : dead) on_gone_(peer);
    if (!dead.empty()) continue;  // the list may have changed meanwhile
    const int n = poll(fds.data(), fds.size(), unsure ? int(kUnsureLookNs / 1'000'000) : -1);
    if (unsure) LookAtUnsure();  // a wake-up before the time only looks sooner
    if (n <= 0) continue;
    if (fds[0].revents) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof v);
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLHUP | POLLRDHUP | POLLERR))) continue;
      {
        std::lock_guard lock(mu_);
        watched_.erase(peers[i]);
      }
      close(fds[i].fd);
      on_gone_(peers[i]);
    }
  }
}

}  // namespace uroce::rdmacm
