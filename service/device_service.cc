#include "service/device_service.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "wire/udp_socket.h"
#include "wire/unix_socket.h"

namespace uroce::service {

namespace asio = boost::asio;
using Descriptor = asio::posix::stream_descriptor;

namespace {

// Most datagrams taken from UDP 4791 per readiness: the service then lets control messages in.
constexpr unsigned kUdpBatch = 64;
constexpr size_t kMaxDatagram = 9216;
// What the service asks for its UDP receive buffer (capped by net.core.rmem_max for a user).
constexpr int kUdpBufferBytes = 64 << 20;

}  // namespace

DeviceService::Process::~Process() {
  if (forward_fd >= 0) close(forward_fd);
}

DeviceService::DeviceService(asio::io_context& io, const wire::IpAddress& address, uint16_t udp_port,
                             std::chrono::milliseconds linger)
    : io_(io),
      address_(address),
      udp_port_(udp_port),
      linger_(linger),
      acceptor_(io),
      udp_(io),
      linger_timer_(io),
      buffers_(size_t{kUdpBatch} * (wire::ForwardHeader::kSize + kMaxDatagram)) {}

DeviceService::~DeviceService() = default;

int DeviceService::Start() {
  boost::system::error_code ec;
  const std::string name = wire::DeviceServiceName(address_);
  sockaddr_un sun;
  if (name.size() + 1 > sizeof sun.sun_path) return -ENAMETOOLONG;
  const socklen_t len = wire::AbstractUnixAddress(name, &sun);
  const int listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd < 0) return -errno;
  if (bind(listen_fd, reinterpret_cast<sockaddr*>(&sun), len) < 0 || listen(listen_fd, SOMAXCONN) < 0) {
    const int err = errno;
    close(listen_fd);
    return -err;
  }
  acceptor_.assign(listen_fd);
  wire::UdpEndpoint local;
  const int fd = wire::OpenRoceUdpSocket({address_, udp_port_}, kUdpBufferBytes, &local);
  if (fd < 0) {
    udp_error_ = -fd;
  } else {
    udp_fd_ = fd;
    udp_.assign(fd);
    udp_.non_blocking(true, ec);
  }
  AcceptNext();
  if (udp_fd_ >= 0) WaitUdp();
  ArmLingerIfIdle();
  return 0;
}

void DeviceService::Run() { io_.run(); }

void DeviceService::AcceptNext() {
  acceptor_.async_wait(Descriptor::wait_read, [this](const boost::system::error_code& ec) {
    if (ec) return;  // closed: the service leaves
    for (;;) {
      const int fd = accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) break;  // EAGAIN: all taken; anything else (EMFILE): the next readiness tries again
      auto p = std::make_shared<Process>(io_);
      p->control.assign(fd);
      Admit(std::move(p));
    }
    AcceptNext();
  });
}

void DeviceService::Admit(std::shared_ptr<Process> p) {
  if (!wire::PeerIsUsOrRoot(p->control.native_handle())) {  // our user or root may share our device
    ++counters_.bad_control;
    Reply(*p, wire::ControlType::kWelcome, EACCES, 0);
    return;  // closes when p goes
  }
  ++processes_;
  linger_timer_.cancel();
  ReadControl(std::move(p));
}

void DeviceService::ReadControl(std::shared_ptr<Process> p) {
  p->control.async_wait(Descriptor::wait_read, [this, p](const boost::system::error_code& ec) {
    if (ec == asio::error::operation_aborted) return;
    // Every descriptor that comes along is ours to close unless a kHello keeps its first.
    wire::ControlMessage m;
    std::vector<int> fds;
    const int rc = ec ? -ENOTCONN : wire::TakeControl(p->control.native_handle(), &m, &fds);
    if (rc == -EAGAIN) return ReadControl(p);
    if (rc == -EPROTO) {
      ++counters_.bad_control;
      Reply(*p, wire::ControlType::kReply, EINVAL, 0);
      return ReadControl(p);
    }
    if (rc < 0) return Leave(*p);  // the process closed its connection: it exited or died
    const int passed = fds.empty() ? -1 : fds.front();
    for (size_t i = 1; i < fds.size(); ++i) close(fds[i]);
    HandleControl(*p, m, passed);
    ReadControl(p);
  });
}

void DeviceService::HandleControl(Process& p, const wire::ControlMessage& m, int passed_fd) {
  using wire::ControlType;
  auto refuse = [&](int err, ControlType reply) {
    if (passed_fd >= 0) close(passed_fd);
    ++counters_.bad_control;
    Reply(p, reply, err, 0);
  };
  switch (m.type) {
    case ControlType::kHello: {
      if (p.owner != 0 || passed_fd < 0) return refuse(EINVAL, ControlType::kWelcome);
      int type = 0;
      socklen_t len = sizeof type;
      if (getsockopt(passed_fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_DGRAM) {
        return refuse(EINVAL, ControlType::kWelcome);
      }
      if (udp_error_ != 0) return refuse(udp_error_, ControlType::kWelcome);
      const uint8_t owner = NextOwner();
      if (owner == 0) return refuse(EUSERS, ControlType::kWelcome);
      p.owner = owner;
      p.forward_fd = passed_fd;
      by_owner_[owner] = &p;
      ++counters_.processes_joined;
      return Reply(p, ControlType::kWelcome, 0, owner);
    }
    case ControlType::kListen: {
      if (p.owner == 0) return refuse(EINVAL, ControlType::kReply);
      auto [it, inserted] = listeners_.emplace(m.value, p.owner);
      if (!inserted && it->second != p.owner) return refuse(EADDRINUSE, ControlType::kReply);
      return Reply(p, ControlType::kReply, 0, m.value);
    }
    case ControlType::kUnlisten: {
      auto it = listeners_.find(m.value);
      if (it != listeners_.end() && it->second == p.owner) listeners_.erase(it);
      return Reply(p, ControlType::kReply, 0, m.value);
    }
    default:
      return refuse(EINVAL, ControlType::kReply);
  }
}

void DeviceService::Reply(Process& p, wire::ControlType type, int32_t status, uint64_t value) {
  // A process that does not read its replies is its own problem: never block the service on it.
  wire::SendControl(p.control.native_handle(), {type, status, value}, -1, MSG_DONTWAIT);
}

void DeviceService::Leave(Process& p) {
  if (p.owner != 0) {
    by_owner_[p.owner] = nullptr;
    for (auto it = listeners_.begin(); it != listeners_.end();) {
      it = it->second == p.owner ? listeners_.erase(it) : std::next(it);
    }
    p.owner = 0;
  }
  boost::system::error_code ec;
  p.control.close(ec);
  --processes_;
  ArmLingerIfIdle();
}

uint8_t DeviceService::NextOwner() {
  for (unsigned tried = 0; tried < wire::kMaxOwners; ++tried) {
    last_owner_ = static_cast<uint8_t>(last_owner_ % wire::kMaxOwners + 1);
    if (by_owner_[last_owner_] == nullptr) return last_owner_;
  }
  return 0;
}

void DeviceService::ArmLingerIfIdle() {
  if (processes_ != 0) return;
  linger_timer_.expires_after(linger_);
  linger_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || processes_ != 0) return;
    // Nobody for `linger`: give the name and the port back, and let Run return.
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    udp_.close(ignored);
    io_.stop();
  });
}

void DeviceService::WaitUdp() {
  udp_.async_wait(Descriptor::wait_read, [this](const boost::system::error_code& ec) {
    if (ec) return;
    // A full batch means more is queued: take up to 16 before control messages get their turn.
    for (int batches = 0; batches < 16 && DrainUdp() == int(kUdpBatch); ++batches) {
    }
    WaitUdp();
  });
}

DeviceService::Process* DeviceService::RouteTo(std::span<const uint8_t> packet) {
  const wire::PacketRoute route = wire::RouteOf(packet);
  uint8_t owner = route.owner;
  if (route.kind == wire::PacketRoute::Kind::kListener) {
    auto it = listeners_.find(route.service_id);
    owner = it == listeners_.end() ? 0 : it->second;
  } else if (route.kind == wire::PacketRoute::Kind::kUnroutable) {
    owner = 0;
  }
  return owner == 0 ? nullptr : by_owner_[owner];
}

int DeviceService::DrainUdp() {
  const size_t slot = wire::ForwardHeader::kSize + kMaxDatagram;
  mmsghdr msgs[kUdpBatch] = {};
  iovec iovs[kUdpBatch];
  sockaddr_storage from[kUdpBatch];
  for (unsigned i = 0; i < kUdpBatch; ++i) {
    // Each datagram lands behind room for its ForwardHeader, so it is forwarded without a copy.
    iovs[i] = {buffers_.data() + i * slot + wire::ForwardHeader::kSize, kMaxDatagram};
    msgs[i].msg_hdr.msg_iov = &iovs[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
    msgs[i].msg_hdr.msg_name = &from[i];
    msgs[i].msg_hdr.msg_namelen = sizeof from[i];
  }
  const int n = recvmmsg(udp_fd_, msgs, kUdpBatch, MSG_DONTWAIT, nullptr);
  if (n <= 0) return 0;
  const bool congested = wire::ReceiveQueueCongested(udp_fd_);
  // Each datagram with its owner, its ForwardHeader written in front of it; then runs for one process leave in one
  // sendmmsg (a stream from a peer host is mostly one run).
  Process* owners[kUdpBatch];
  mmsghdr out[kUdpBatch] = {};
  iovec out_iovs[kUdpBatch];
  int routed = 0;
  for (int i = 0; i < n; ++i) {
    ++counters_.received;
    if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) continue;
    const std::span<const uint8_t> packet(buffers_.data() + i * slot + wire::ForwardHeader::kSize, msgs[i].msg_len);
    Process* p = RouteTo(packet);
    wire::ForwardHeader h;
    if (p == nullptr || !wire::FromSockaddr(&from[i], msgs[i].msg_hdr.msg_namelen, &h.src)) {
      ++counters_.no_route;
      continue;
    }
    h.dst = {address_, udp_port_};
    h.congestion_experienced = congested;
    uint8_t* start = buffers_.data() + i * slot;
    h.Encode(start);
    owners[routed] = p;
    out_iovs[routed] = {start, wire::ForwardHeader::kSize + packet.size()};
    out[routed].msg_hdr.msg_iov = &out_iovs[routed];
    out[routed].msg_hdr.msg_iovlen = 1;
    ++routed;
  }
  for (int i = 0; i < routed;) {
    int j = i + 1;
    while (j < routed && owners[j] == owners[i]) ++j;
    const int sent = sendmmsg(owners[i]->forward_fd, out + i, unsigned(j - i), MSG_DONTWAIT | MSG_NOSIGNAL);
    const int ok = sent > 0 ? sent : 0;
    counters_.forwarded += uint64_t(ok);
    counters_.process_full += uint64_t(j - i - ok);  // its socket was full: dropped, as a full receive queue drops
    i = j;
  }
  return n;
}

std::string DeviceService::CountersText() const {
  const ServiceCounters& c = counters_;
  return "received " + std::to_string(c.received) + "\nforwarded " + std::to_string(c.forwarded) + "\nno_route " +
         std::to_string(c.no_route) + "\nprocess_full " + std::to_string(c.process_full) + "\nbad_control " +
         std::to_string(c.bad_control) + "\nprocesses_joined " + std::to_string(c.processes_joined) + "\n";
}

}  // namespace uroce::service
