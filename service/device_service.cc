#include "service/device_service.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "wire/cm_mad.h"
#include "wire/event_fd.h"
#include "wire/host_addresses.h"
#include "wire/icrc.h"
#include "wire/packet.h"
#include "wire/udp_socket.h"
#include "wire/unix_socket.h"

namespace uroce::service {

namespace asio = boost::asio;
using Descriptor = asio::posix::stream_descriptor;

namespace {

// Receives per recvmmsg, each a datagram or a UDP_GRO run of up to 64 (WaitUdp takes 16 recvmmsgs' worth before
// control messages get their turn).
constexpr unsigned kUdpBatch = 16;
constexpr size_t kMaxDatagram = 9216;
// What the service asks for its UDP receive buffer (capped by net.core.rmem_max for a user).
constexpr int kUdpBufferBytes = 64 << 20;

}  // namespace

DeviceService::Process::~Process() {
  if (forward_fd >= 0) close(forward_fd);
  if (doorbell >= 0) close(doorbell);
}

DeviceService::DeviceService(asio::io_context& io, const wire::IpAddress& address, uint16_t udp_port,
                             std::chrono::milliseconds linger, unsigned max_processes, bool every_address)
    : io_(io),
      address_(address),
      udp_port_(udp_port),
      every_address_(every_address),
      address_changes_(io),
      gids_(address),
      linger_(linger),
      max_processes_(max_processes),
      acceptor_(io),
      udp_(std::make_shared<Descriptor>(io)),
      linger_timer_(io) {
  owner_socket_.fill(-1);
}

DeviceService::~DeviceService() {
  for (int fd : owner_socket_) {
    if (fd >= 0) close(fd);
  }
}

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
  // Our socket heads a new SO_REUSEPORT group (the kernel steering, AttachOwnerSteering). One of our own sockets
  // still bound there (processes of a service that was killed, before they close theirs) would make ours join
  // that group at another index: so the port must be free first, as one bind without SO_REUSEPORT says; it is
  // waited for up to 0.5 s (those processes close theirs as soon as they see the service gone).
  int fd = -EADDRINUSE;
  for (int tries = 0; tries < 25 && fd == -EADDRINUSE; ++tries) {
    if (tries > 0) usleep(20'000);
    const int probe = wire::OpenRoceUdpSocket({address_, udp_port_}, 0, &local);
    if (probe < 0) {
      fd = probe;
      continue;
    }
    close(probe);
    fd = wire::OpenRoceUdpSocket({address_, udp_port_}, kUdpBufferBytes, &local, /*reuse_port=*/true);
  }
  if (fd < 0) {
    udp_error_ = -fd;
  } else {
    // Without the kernel's steering (an old kernel) every packet comes here and is forwarded, as before.
    steering_ = wire::AttachOwnerSteering(fd, steer_to_) == 0;
    // Runs from a peer host's UDP_SEGMENT sends arrive whole (UDP_GRO): one receive for up to 64 of its packets.
    bool gso = false, gro = false;
    wire::EnableUdpOffloads(fd, &gso, &gro);
    if (int rc = receiver_.Init(kUdpBatch, kMaxDatagram, gro); rc < 0) {
      close(fd);
      return rc;
    }
    udp_fd_ = fd;
    udp_->assign(fd);
    udp_->non_blocking(true, ec);
  }
  AcceptNext();
  if (udp_fd_ >= 0) WaitUdp(udp_, {address_, udp_port_});
  if (udp_fd_ >= 0 && every_address_) {
    if (int rc = wire::SharedGidTable::Create(&shared_gids_); rc < 0) {
      fprintf(stderr, "uroce-deviced: cannot share the GID table (%s): processes list GID 0 alone\n", strerror(-rc));
    } else {
      shared_gids_->Publish(gids_.Entries());
    }
    // Watched first, so that no change between the first look and the watch goes unseen.
    const int changes = wire::OpenAddressChanges();
    if (changes >= 0) {
      address_changes_.assign(changes);
      WaitAddressChanges();
    }
    FollowOtherAddresses();
  }
  ArmLingerIfIdle();
  return 0;
}

void DeviceService::FollowOtherAddresses() {
  const std::vector<wire::IpAddress> wanted = wire::OtherGids(address_);
  for (auto it = others_.begin(); it != others_.end();) {
    if (std::find(wanted.begin(), wanted.end(), it->first) != wanted.end()) {
      ++it;
      continue;
    }
    boost::system::error_code ignored;
    it->second->close(ignored);  // closes the socket: the address is gone
    it = others_.erase(it);
  }
  for (const wire::IpAddress& a : wanted) {
    if (others_.count(a)) continue;
    wire::UdpEndpoint local;
    // Another program's UDP 4791 there (kernel rxe's on every address) leaves the address out: what comes to it is
    // that program's.
    const int fd = wire::OpenRoceUdpSocket({a, udp_port_}, kUdpBufferBytes, &local);
    if (fd < 0) continue;
    bool gso = false, gro = false;
    wire::EnableUdpOffloads(fd, &gso, &gro);  // the receiver takes runs whole (its buffers are sized for them)
    auto other = std::make_shared<Descriptor>(io_, fd);
    boost::system::error_code ec;
    other->non_blocking(true, ec);
    WaitUdp(other, {a, udp_port_});
    others_.emplace(a, std::move(other));
  }
  // The table lists the addresses we receive on, in the host's order (lowest first) as they come.
  std::vector<wire::IpAddress> listed;
  for (const wire::IpAddress& a : wanted)
    if (others_.count(a)) listed.push_back(a);
  if (gids_.Update(listed) && shared_gids_) shared_gids_->Publish(gids_.Entries());
}

void DeviceService::WaitAddressChanges() {
  address_changes_.async_wait(Descriptor::wait_read, [this](const boost::system::error_code& ec) {
    if (ec) return;
    if (wire::TakeAddressChanges(address_changes_.native_handle())) FollowOtherAddresses();
    WaitAddressChanges();
  });
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
    HandleControl(*p, m, fds);
    ReadControl(p);
  });
}

void DeviceService::HandleControl(Process& p, const wire::ControlMessage& m, std::vector<int>& fds) {
  using wire::ControlType;
  const wire::UntakenDescriptors close_untaken(fds);  // what came along and is not kept is closed on the way out
  const int passed_fd = fds.empty() ? -1 : fds.front();
  auto refuse = [&](int err, ControlType reply) {
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
      const uint8_t owner = members_ < max_processes_ ? NextOwner() : 0;
      if (owner == 0) return refuse(EUSERS, ControlType::kWelcome);
      ++members_;
      p.owner = owner;
      p.pid = pid_t(m.value);
      p.forward_fd = passed_fd;
      fds.front() = -1;
      by_owner_[owner] = &p;
      ++counters_.processes_joined;
      // Its own socket, if the kernel steers: handed over with the welcome, steered to once the process says it
      // receives there (kSteer): until then, and for one that never says so, we forward.
      const int udp = steering_ ? SteeredSocket(owner) : -1;
      std::vector<int> passed;
      if (shared_gids_) passed.push_back(shared_gids_->fd());
      if (udp >= 0) passed.push_back(udp);
      const uint64_t value = owner | (every_address_ ? wire::kWelcomeEveryAddress : 0) |
                             (shared_gids_ ? wire::kWelcomeGidTable : 0);
      wire::SendControl(p.control.native_handle(), {ControlType::kWelcome, 0, value}, passed, MSG_DONTWAIT);
      return;
    }
    case ControlType::kSteer: {
      if (p.owner == 0 || !steering_ || owner_socket_[p.owner] < 0) return refuse(EINVAL, ControlType::kReply);
      if (steer_to_[p.owner] == 0) {
        steer_to_[p.owner] = socket_index_[p.owner];
        Steer();
        ++counters_.steered;
      }
      return Reply(p, ControlType::kReply, 0, m.value);
    }
    case ControlType::kAdoptOwner: {
      // A number whose process has left, taken over by one that holds XRC target QPs of it, which it runs on from
      // there (wire/direct_access.h): its packets go there until that process leaves. Not a live process's number.
      const uint64_t n = m.value;
      if (p.owner == 0 || n == 0 || n >= 256 || n == p.owner) return refuse(EINVAL, ControlType::kReply);
      if (Process* holder = by_owner_[n]; holder != nullptr) {
        const bool taken_over = holder->owner != n;
        return Reply(p, ControlType::kReply, taken_over ? (holder == &p ? 0 : EALREADY) : EAGAIN, n);
      }
      by_owner_[n] = &p;
      p.adopted.push_back(uint8_t(n));
      ++counters_.adopted;
      if (steer_to_[p.owner] != 0) {
        steer_to_[n] = steer_to_[p.owner];
        Steer();
      }
      return Reply(p, ControlType::kReply, 0, n);
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
    case ControlType::kRingOffer: {
      // From now on this process's packets go into its ring (it takes what is still on its socket first).
      if (p.owner == 0 || p.ring || fds.size() != 2 || wire::TakeDoorbell(fds[1]) < 0 ||
          wire::PacketRing::Attach(fds[0], &p.ring) < 0) {
        return refuse(EINVAL, ControlType::kReply);
      }
      p.doorbell = fds[1];
      fds[1] = -1;
      ++counters_.rings;
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
  for (uint8_t n : p.adopted) {
    by_owner_[n] = nullptr;
    steer_to_[n] = 0;
  }
  if (!p.adopted.empty()) Steer();
  p.adopted.clear();
  if (p.owner != 0) {
    by_owner_[p.owner] = nullptr;
    if (steer_to_[p.owner] != 0) {
      steer_to_[p.owner] = 0;  // its late packets come here, and meet no route
      Steer();
    }
    for (auto it = listeners_.begin(); it != listeners_.end();) {
      it = it->second == p.owner ? listeners_.erase(it) : std::next(it);
    }
    p.owner = 0;
    --members_;
  }
  boost::system::error_code ec;
  p.control.close(ec);
  --processes_;
  ArmLingerIfIdle();
}

int DeviceService::SteeredSocket(uint8_t owner) {
  int& fd = owner_socket_[owner];
  if (fd < 0) {
    wire::UdpEndpoint local;
    const int made = wire::OpenRoceUdpSocket({address_, udp_port_}, kUdpBufferBytes, &local, /*reuse_port=*/true);
    if (made < 0) return made;
    fd = made;
    socket_index_[owner] = group_size_++;  // UDP_GRO: the process asks for it before it asks to be steered
  } else {
    // What was steered to the number's former holder before its death was seen: not for the newcomer.
    uint8_t byte;
    while (recv(fd, &byte, 1, MSG_DONTWAIT | MSG_TRUNC) >= 0) {
    }
  }
  return fd;
}

void DeviceService::Steer() {
  // A failure leaves the former program, which steers a departed owner's packets to its socket (lost, as a dead
  // process's) or a newcomer's to the service (forwarded): nothing is misdelivered.
  wire::AttachOwnerSteering(udp_fd_, steer_to_);
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
    udp_->close(ignored);
    address_changes_.close(ignored);
    for (auto& [address, socket] : others_) socket->close(ignored);
    others_.clear();
    io_.stop();
  });
}

void DeviceService::WaitUdp(std::shared_ptr<Descriptor> socket, const wire::UdpEndpoint& local) {
  Descriptor& waited = *socket;
  waited.async_wait(Descriptor::wait_read, [this, socket = std::move(socket),
                                            local](const boost::system::error_code& ec) {
    // Closed: the service leaves, or another address went (FollowOtherAddresses), perhaps after this wait completed.
    if (ec || !socket->is_open()) return;
    // Up to 16 receives while datagrams keep coming, before control messages get their turn.
    for (int receives = 0; receives < 16 && DrainUdp(socket->native_handle(), local) > 0; ++receives) {
    }
    WaitUdp(socket, local);
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

int DeviceService::DrainUdp(int fd, const wire::UdpEndpoint& local) {
  const auto forward = [this, fd, &local](const wire::InDatagram& d) { Forward(d, fd, local.addr); };
  const int n = receiver_.Receive(fd, forward, local, udp_counters_);
  // One Publish per ring and receive: a run from a peer host is mostly for one process, and its doorbell rings once.
  for (Process* p : unpublished_) {
    p->unpublished = false;
    if (p->ring->Publish()) wire::SignalEventFd(p->doorbell);
  }
  unpublished_.clear();
  return n;
}

void DeviceService::AnswerUnheardRequest(const wire::InDatagram& d, int fd, const wire::IpAddress& bound) {
  if (fd < 0 || wire::RouteOf(d.payload).kind != wire::PacketRoute::Kind::kListener) return;
  auto view = wire::ParsePacket(d.payload);
  if (!view) return;
  auto request = wire::ParseCmMad(view.value().payload);
  if (!request) return;
  const std::optional<wire::CmMad> answer = wire::NoListenerAnswer(request.value());
  if (!answer) return;
  const std::array<uint8_t, wire::kMadSize> mad = wire::EncodeCmMad(*answer);
  const wire::PacketSpec spec = wire::GsiMadSpec(gsi_psn_++);
  std::vector<uint8_t> packet(wire::EncodedLength(spec, mad.size()));
  if (!wire::EncodePacket(spec, mad, packet)) return;
  // From the address the REQ came to, as the kernel's CM answers.
  const wire::UdpEndpoint local{d.dst.addr, udp_port_}, to{d.src.addr, udp_port_};
  wire::SealIcrc(wire::Flow{local, to, 0}, packet);
  wire::OutDatagram answer_datagram{to, 0, packet};
  answer_datagram.src_addr = local.addr;
  std::atomic<bool> gso{false};  // one datagram
  if (wire::SendDatagrams(fd, wire::SocketFamily({bound, 0}), bound, {&answer_datagram, 1}, kMaxDatagram, 1, gso,
                          udp_counters_, MSG_DONTWAIT) == 1)
    ++counters_.refused;
}

void DeviceService::Forward(const wire::InDatagram& d, int fd, const wire::IpAddress& bound) {
  ++counters_.received;
  Process* p = RouteTo(d.payload);
  if (p == nullptr) {
    ++counters_.no_route;
    AnswerUnheardRequest(d, fd, bound);
    return;
  }
  wire::ForwardHeader h;
  h.src = d.src;
  h.dst = {d.dst.addr, udp_port_};  // which of the host's addresses (the wildcard receives at each)
  h.congestion_experienced = d.congestion_experienced;
  uint8_t header[wire::ForwardHeader::kSize];
  h.Encode(header);
  bool taken;
  if (p->ring) {
    taken = p->ring->Write(header, d.payload);
    if (taken && !p->unpublished) {
      p->unpublished = true;
      unpublished_.push_back(p);
    }
  } else {
    iovec iov[2] = {{header, sizeof header}, {const_cast<uint8_t*>(d.payload.data()), d.payload.size()}};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = 2;
    taken = sendmsg(p->forward_fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0;
  }
  // A full ring or socket: dropped, as a full receive queue drops.
  ++(taken ? counters_.forwarded : counters_.process_full);
}

std::string DeviceService::CountersText() const {
  const ServiceCounters& c = counters_;
  return "received " + std::to_string(c.received) + "\nforwarded " + std::to_string(c.forwarded) + "\nno_route " +
         std::to_string(c.no_route) + "\nrefused " + std::to_string(c.refused) + "\nprocess_full " +
         std::to_string(c.process_full) + "\nrings " + std::to_string(c.rings) + "\nbad_control " +
         std::to_string(c.bad_control) + "\nprocesses_joined " + std::to_string(c.processes_joined) + "\nsteered " +
         std::to_string(c.steered) + "\nadopted " + std::to_string(c.adopted) + "\n";
}

}  // namespace uroce::service
