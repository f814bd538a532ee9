#include "wire/host_device_transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "wire/clock.h"
#include "wire/event_fd.h"
#include "wire/service_protocol.h"
#include "wire/unix_socket.h"

namespace uroce::wire {

namespace {

// What a connection to another process may hold before a packet is dropped: asked for, capped by net.core.wmem_max
// unless we may force it.
constexpr int kPeerBufferBytes = 4 << 20;

// epoll tags of the fixed descriptors; accepted connections are tagged with their descriptor (>= 0).
constexpr uint64_t kTagForward = uint64_t(-1), kTagWake = uint64_t(-2), kTagControl = uint64_t(-3),
                   kTagListen = uint64_t(-4), kTagSteered = uint64_t(-5);
// The steered socket's receives: up to this many recvmmsg entries, each a datagram or a UDP_GRO run.
constexpr unsigned kSteeredBatch = 16;
// Another process we use the direct-access table of, watched for its exit (its pidfd) and its connection's hang-up:
// this bit | the Peer's address.
constexpr uint64_t kTagPeer = uint64_t{1} << 62;
// The listener under an adopted owner's name (AdoptOwner): this bit | its descriptor.
constexpr uint64_t kTagAdoptedListen = uint64_t{1} << 61;

}  // namespace

HostDeviceTransport::HostDeviceTransport(std::unique_ptr<Transport> sender, const UdpEndpoint& local, uint8_t owner,
                                         int forward_fd, int control_fd, std::function<void()> on_service_lost,
                                         SameHostPath same_host)
    : sender_(std::move(sender)),
      local_(local),
      owner_(owner),
      forward_fd_(forward_fd),
      control_fd_(control_fd),
      same_host_(same_host),
      on_service_lost_(std::move(on_service_lost)),
      buffers_(size_t{kBatch} * kMaxForwarded) {}

HostDeviceTransport::~HostDeviceTransport() {
  for (int fd : adopted_listen_fds_) close(fd);
  for (int fd : {forward_fd_, wake_fd_, epoll_fd_, listen_fd_, direct_table_fd_, steered_fd_}) {
    if (fd >= 0) close(fd);
  }
  for (Inbound& in : inbound_) {
    if (in.fd != forward_fd_) close(in.fd);
  }
}

HostDeviceTransport::Peer::~Peer() {
  for (int f : {fd, doorbell, pidfd.load(std::memory_order_acquire)}) {
    if (f >= 0) close(f);
  }
}

int HostDeviceTransport::Init() {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return -errno;
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return -errno;
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return -errno;
  sockaddr_un sun;
  const socklen_t len = AbstractUnixAddress(HostDevicePeerName(local_.addr, owner_), &sun);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&sun), len) < 0 || listen(listen_fd_, SOMAXCONN) < 0) return -errno;
  auto add = [&](int fd, uint32_t events, uint64_t tag) {
    epoll_event e{};
    e.events = events;
    e.data.u64 = tag;
    return epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &e) == 0 ? 0 : -errno;
  };
  if (int rc = add(forward_fd_, EPOLLIN, kTagForward)) return rc;
  if (int rc = add(wake_fd_, EPOLLIN, kTagWake)) return rc;
  if (int rc = add(listen_fd_, EPOLLIN, kTagListen)) return rc;
  if (steered_fd_ >= 0) {
    bool gso = false, gro = false;
    EnableUdpOffloads(steered_fd_, &gso, &gro);
    if (int rc = steered_receiver_.Init(kSteeredBatch, kMaxDatagram, gro); rc < 0) return rc;
    if (int rc = add(steered_fd_, EPOLLIN, kTagSteered)) return rc;
  }
  if (control_fd_ >= 0) {
    if (int rc = add(control_fd_, EPOLLRDHUP, kTagControl)) return rc;  // hang-up only: replies are read elsewhere
  }
  return 0;
}

int HostDeviceTransport::OfferRing(const std::function<int(int ring_fd, uint64_t ring_bytes, int doorbell)>& offer,
                                   std::unique_ptr<PacketRing>* ring) {
  int ring_fd = -1;
  if (int rc = PacketRing::Create(PacketRing::kDefaultDataBytes, ring, &ring_fd); rc < 0) return rc;
  const int err = offer(ring_fd, (*ring)->data_bytes(), wake_fd_);
  close(ring_fd);  // the other end has its own descriptor now, or none
  if (err != 0) ring->reset();
  return -err;
}

int HostDeviceTransport::OfferServiceRing(
    const std::function<int(int ring_fd, uint64_t ring_bytes, int doorbell)>& offer) {
  Inbound in;
  in.fd = forward_fd_;
  if (int rc = OfferRing(offer, &in.ring); rc < 0) return rc;
  inbound_.push_back(std::move(in));
  rings_ = true;
  return 0;
}

void HostDeviceTransport::Wake() { SignalEventFd(wake_fd_); }

int HostDeviceTransport::ReceiveQueued(int fd, const DatagramHandler& handler, bool* closed) {
  mmsghdr msgs[kBatch] = {};
  iovec iovs[kBatch];
  for (unsigned i = 0; i < kBatch; ++i) {
    iovs[i] = {buffers_.data() + size_t{i} * kMaxForwarded, kMaxForwarded};
    msgs[i].msg_hdr.msg_iov = &iovs[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  const int n = recvmmsg(fd, msgs, kBatch, MSG_DONTWAIT, nullptr);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
  const uint64_t now = BatchedClock::Instance().NowNs();
  const ClockBatch batch(now);  // the device's readings while it handles them
  int delivered = 0;
  for (int i = 0; i < n; ++i) {
    if (msgs[i].msg_len == 0) {  // a peer connection's end (SOCK_SEQPACKET: EOF)
      if (closed) *closed = true;
      break;
    }
    if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) {
      malformed_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    delivered += Deliver({static_cast<const uint8_t*>(iovs[i].iov_base), msgs[i].msg_len}, now, fd != forward_fd_,
                         handler);
  }
  return delivered;
}

bool HostDeviceTransport::Deliver(std::span<const uint8_t> bytes, uint64_t now, bool from_peer,
                                  const DatagramHandler& handler) {
  auto header = ForwardHeader::Decode(bytes);
  if (!header || bytes.size() <= ForwardHeader::kSize) {
    malformed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // A record other than a packet comes only from another process of the host (in its ring or, before, on its
  // connection).
  if (header->record != RingRecord::kPacket && !from_peer) {
    malformed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (header->record == RingRecord::kXrcTargetModify) {
    // An answer to a request of ours (ModifyXrcTarget): for the thread waiting for it, not for the device.
    const auto m = XrcTargetModify::Decode(bytes.subspan(ForwardHeader::kSize));
    if (!m) {
      malformed_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (m->answer) {
      std::lock_guard lock(modify_mu_);
      modify_answers_[m->request] = m->result;
      modify_answered_.notify_all();
      return false;
    }
  }
  if (header->record == RingRecord::kCopyOffer) {
    const auto offer = CopyOffer::Decode(bytes.subspan(ForwardHeader::kSize));
    if (!offer) {
      malformed_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    TakeCopyOffer(offer->owner);
    return true;
  }
  if (header->record == RingRecord::kXrcDelivery) {
    // The process whose target QP hands us a message is watched (a connection of ours to it, as to any process we
    // send to), so that its death, which leaves the message unfinished, is reported (SetPeerGoneHandler).
    const auto delivery = XrcDelivery::Decode(bytes.subspan(ForwardHeader::kSize));
    const uint8_t owner = delivery ? OwnerOf24(delivery->target_qpn) : 0;
    if (delivery && delivery->first && owner != 0 && !IsOurs(owner)) PeerFor(owner, false);
  }
  InDatagram d;
  d.src = header->src;
  d.dst = header->dst;
  d.record = header->record;
  d.payload = bytes.subspan(ForwardHeader::kSize);
  d.timestamp_ns = now;
  d.congestion_experienced = header->congestion_experienced;
  // A process of this host sealed its ICRC for IPv4 ID 0 (DF from an unconnected socket, Transport::OutgoingFlow)
  // and no network renumbered it: checked for that ID rather than inferred (Device::IcrcVerifies). What the service
  // forwards came over a real network, where a peer's IDs change (kernel rxe, NICs).
  if (from_peer) {
    d.ip_id = 0;
    d.icrc_vouched = header->icrc_vouched;
  }
  handler(d);
  return true;
}

int HostDeviceTransport::DrainRing(Inbound& in, uint64_t now, const DatagramHandler& handler) {
  int delivered = 0;
  if (!in.socket_drained) {
    if (!in.ring->HasRecords()) return 0;
    // The sender wrote into the ring only after its packets on the connection had been queued there: those first.
    bool closed = false;
    int r;
    while ((r = ReceiveQueued(in.fd, handler, &closed)) > 0) delivered += r;
    in.socket_drained = true;
  }
  const bool from_peer = in.fd != forward_fd_;
  const int n =
      in.ring->Drain(kBatch, [&](std::span<const uint8_t> record) { Deliver(record, now, from_peer, handler); });
  if (n < 0) {  // records that do not add up: nothing more is read from it (its sender's packets are lost)
    malformed_.fetch_add(1, std::memory_order_relaxed);
    in.ring.reset();
    return delivered;
  }
  return delivered + n;
}

int HostDeviceTransport::DrainRings(const DatagramHandler& handler) {
  if (!rings_) return 0;
  uint64_t now = 0;  // read only when a ring has records: a polling thread looks here a few million times a second
  int delivered = 0;
  for (Inbound& in : inbound_) {
    if (!in.ring || !in.ring->HasRecords()) continue;
    if (now == 0) now = BatchedClock::Instance().NowNs();
    const ClockBatch batch(now);  // the device's readings while it handles them
    delivered += DrainRing(in, now, handler);
  }
  return delivered;
}

void HostDeviceTransport::Accept(int listener) {
  for (;;) {
    const int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    if (!PeerIsUsOrRoot(fd)) {  // a stranger dialled our name
      close(fd);
      continue;
    }
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = uint64_t(fd);
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &e) < 0) {
      close(fd);
      continue;
    }
    Inbound in;
    in.fd = fd;
    // Offer a ring (or say there is none, so that the sender stops asking): the memfd and our doorbell.
    // With direct access on, our table comes along (wire/direct_access.h).
    if (same_host_ == SameHostPath::kSharedMemory) {
      OfferRing(
          [fd, table = direct_table_fd_](int ring_fd, uint64_t bytes, int doorbell) {
            const int passed[3] = {ring_fd, doorbell, table};
            return -SendControl(fd, {ControlType::kRingOffer, 0, bytes},
                                std::span<const int>(passed, table >= 0 ? 3 : 2), MSG_DONTWAIT);
          },
          &in.ring);
    }
    if (!in.ring) SendControl(fd, {ControlType::kRingOffer, ENOTSUP, 0}, std::span<const int>(), MSG_DONTWAIT);
    rings_ = rings_ || in.ring != nullptr;
    inbound_.push_back(std::move(in));
  }
}

void HostDeviceTransport::CloseInbound(int fd, const DatagramHandler& handler) {
  auto it = std::find_if(inbound_.begin(), inbound_.end(), [fd](const Inbound& in) { return in.fd == fd; });
  if (it == inbound_.end()) return;
  if (it->ring) DrainRing(*it, SystemClock::Instance().NowNs(), handler);  // what it wrote before it went
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  inbound_.erase(it);
  rings_ = std::any_of(inbound_.begin(), inbound_.end(), [](const Inbound& in) { return in.ring != nullptr; });
}

int HostDeviceTransport::ReceiveReady(const DatagramHandler& handler, int timeout_ms) {
  epoll_event events[16];
  const int n = epoll_wait(epoll_fd_, events, 16, timeout_ms);
  if (n < 0) return errno == EINTR ? 0 : -errno;
  int delivered = 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t tag = events[i].data.u64;
    if (tag == kTagWake) {
      uint64_t v;
      [[maybe_unused]] ssize_t r = read(wake_fd_, &v, sizeof v);
      woken_.store(true, std::memory_order_relaxed);
    } else if (tag == kTagSteered) {
      const int r = steered_fd_ >= 0 ? ReceiveSteered(handler) : 0;  // closed by an earlier event of this batch
      if (r > 0) delivered += r;
    } else if (tag == kTagControl) {
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, control_fd_, nullptr);
      if (steered_fd_ >= 0) {
        // The service is gone: our socket leaves its port group, so that the next service finds the port free.
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, steered_fd_, nullptr);
        close(steered_fd_);
        steered_fd_ = -1;
      }
      if (!service_lost_) {
        service_lost_ = true;
        if (on_service_lost_) on_service_lost_();
      }
    } else if (tag == kTagListen) {
      Accept(listen_fd_);
    } else if ((tag & ~(kTagAdoptedListen - 1)) == kTagAdoptedListen) {
      Accept(int(tag & (kTagAdoptedListen - 1)));
    } else if ((tag & ~(kTagPeer - 1)) == kTagPeer) {
      PeerGone(reinterpret_cast<Peer*>(tag & (kTagPeer - 1)));
    } else if (tag == kTagForward) {
      const int r = ReceiveQueued(forward_fd_, handler, nullptr);
      if (r > 0) delivered += r;
    } else {
      const int fd = int(tag);
      bool closed = (events[i].events & (EPOLLHUP | EPOLLERR)) != 0 && (events[i].events & EPOLLIN) == 0;
      // A connection with a ring carries nothing more but its end; without one, its packets.
      const int r = ReceiveQueued(fd, handler, &closed);
      if (r > 0) delivered += r;
      if (closed) CloseInbound(fd, handler);
    }
  }
  return delivered;
}

int HostDeviceTransport::ReceiveSteered(const DatagramHandler& handler) {
  const int n = steered_receiver_.Receive(steered_fd_, handler, local_, steered_counters_);
  if (n <= 0) return 0;
  steered_received_.fetch_add(uint64_t(n), std::memory_order_relaxed);
  steered_until_ns_ = BatchedClock::Instance().NowNs() + kSteeredActiveNs;
  return n;
}

int HostDeviceTransport::Poll(const DatagramHandler& handler, int64_t timeout_ns) {
  if (gone_pending_.load(std::memory_order_acquire)) ReportGone();
  int got = DrainRings(handler);
  if (timeout_ns == 0) {
    const uint64_t now = BatchedClock::Instance().NowNs();  // an application's look has read it already
    if (steered_fd_ >= 0 && now < steered_until_ns_) got += ReceiveSteered(handler);
    if (rings_) {
      if (now - sockets_seen_ns_ < socket_look_every_ns_) return got;
      sockets_seen_ns_ = now;
    }
  }
  const int r = ReceiveReady(handler, 0);
  if (r < 0) return got > 0 ? got : r;
  got += r;
  if (got != 0 || timeout_ns == 0) return got;
  // A Wake() that a look which could not wait consumed (this one or an earlier, maybe another thread's) still ends
  // the first call that could: its caller was asked to look at something (an engine stopping set its flag before it
  // woke us; blocking now would never see it).
  if (woken_.exchange(false, std::memory_order_relaxed)) return got;
  // About to block: the rings' producers ring our doorbell from now on. A record published before they could see
  // the flag is found by the look after setting it (wire/packet_ring.h, "Sleeping").
  bool waiting = false;
  for (Inbound& in : inbound_) {
    if (!in.ring) continue;
    in.ring->SetSleeping(true);
    waiting = waiting || in.ring->HasRecords();
  }
  const int timeout_ms = timeout_ns < 0 ? -1 : int(std::min<int64_t>((timeout_ns + 999'999) / 1'000'000, 1 << 30));
  const int slept = waiting ? 0 : ReceiveReady(handler, timeout_ms);
  woken_.store(false, std::memory_order_relaxed);  // this call returns: whatever woke it is looked at
  for (Inbound& in : inbound_) {
    if (in.ring) in.ring->SetSleeping(false);
  }
  sockets_seen_ns_ = SystemClock::Instance().NowNs();
  got = DrainRings(handler);
  if (slept < 0) return got > 0 ? got : slept;
  return got + slept;
}

void HostDeviceTransport::SetOtherHostAddresses(std::vector<IpAddress> others) {
  std::lock_guard lock(others_mu_);
  const std::vector<IpAddress>* now = nullptr;
  if (!others.empty()) {
    others_kept_.push_back(std::make_unique<const std::vector<IpAddress>>(std::move(others)));
    now = others_kept_.back().get();
  }
  others_.store(now, std::memory_order_release);
}

bool HostDeviceTransport::IsHostEndpoint(const UdpEndpoint& ep) const {
  if (ep.port != local_.port) return false;
  if (ep.addr == local_.addr) return true;
  const std::vector<IpAddress>* others = others_.load(std::memory_order_acquire);
  return others != nullptr && std::find(others->begin(), others->end(), ep.addr) != others->end();
}

uint8_t HostDeviceTransport::PeerOwner(const OutDatagram& dg) const {
  if (same_host_ == SameHostPath::kUdp) return 0;
  if (!IsHostEndpoint(dg.dst)) return 0;
  const PacketRoute route = RouteOf(dg.payload);
  return route.kind == PacketRoute::Kind::kOwner ? route.owner : 0;
}

HostDeviceTransport::Peer* HostDeviceTransport::PeerFor(uint8_t owner, bool reconnect) {
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(owner);
  if (it != peers_.end() && !reconnect && !it->second->closed.load(std::memory_order_relaxed)) {
    return it->second.get();
  }
  if (it != peers_.end()) {
    retired_.push_back(std::move(it->second));
    peers_.erase(it);
  }
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un sun;
  const socklen_t len = AbstractUnixAddress(HostDevicePeerName(local_.addr, owner), &sun);
  pid_t pid = 0;
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&sun), len) < 0) {
    // No such process (now): try again with the next packet. A process listens under its name from the moment it
    // has its number until its end, so one we have talked to is gone.
    if (fd >= 0 && (errno == ECONNREFUSED || errno == ENOENT)) NoteGoneLocked(owner);
    if (fd >= 0) close(fd);
    return nullptr;
  }
  if (!PeerIsUsOrRoot(fd, &pid)) {  // a stranger holds its name
    close(fd);
    return nullptr;
  }
  gone_reported_[owner] = false;
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &kPeerBufferBytes, sizeof kPeerBufferBytes) < 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kPeerBufferBytes, sizeof kPeerBufferBytes);
  }
  auto peer = std::make_unique<Peer>();
  peer->fd = fd;
  peer->pid = pid;
  peer->owner = owner;
  Peer* p = peer.get();
  {
    // Its hang-up takes its table out of use (PeerGone): a dead process's pid may be given to another; and ends our
    // rdma_cm connections with it (on_peer_gone_).
    epoll_event e{};
    e.events = EPOLLRDHUP;
    e.data.u64 = kTagPeer | reinterpret_cast<uint64_t>(p);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &e);
  }
  peers_[owner] = std::move(peer);
  return p;
}

void HostDeviceTransport::ConnectAhead(const UdpEndpoint& dst, uint32_t qpn) {
  if (same_host_ == SameHostPath::kUdp || !IsHostEndpoint(dst)) return;
  const uint8_t owner = OwnerOf24(qpn);
  if (owner == 0) return;
  Peer* peer = PeerFor(owner, false);
  if (peer == nullptr || same_host_ != SameHostPath::kSharedMemory) return;
  std::lock_guard lock(peer->mu);
  if (!peer->offer_answered && direct_table_ != nullptr && !IsOurs(owner)) {
    // With direct access, wait for the offer (its table): a WRITE or READ goes directly only when nothing of its QP
    // is outstanding, so a stream whose first operations went as packets (ib_write_bw keeps 128 in flight) would
    // stay packets to its end. The other process's polling thread answers at once unless it is starved.
    pollfd p{peer->fd, POLLIN, 0};
    poll(&p, 1, kOfferWaitMs);
  }
  if (!peer->offer_answered) TakeRingOffer(*peer);  // without direct access usually not there yet: the first send
}

void HostDeviceTransport::TakeRingOffer(Peer& peer) {
  ControlMessage m;
  std::vector<int> fds;
  const int rc = TakeControl(peer.fd, &m, &fds);
  if (rc == -EAGAIN) return;  // not yet: the receiver offers when its polling thread accepts us
  peer.offer_answered = true;
  if (rc == 0 && m.type == ControlType::kRingOffer && m.status == 0 && (fds.size() == 2 || fds.size() == 3) &&
      TakeDoorbell(fds[1]) == 0 && PacketRing::Attach(fds[0], &peer.ring) == 0) {
    peer.doorbell = fds[1];
    // Its direct-access table, used only if it names the process at the other end of the connection as our pid
    // namespace sees it (a process of another pid namespace cannot be named by pid from here).
    std::unique_ptr<DirectTable> table;
    // Stored, then the hang-up looked at: PeerGone sets `closed` before it clears the table, so one of the two
    // clears it.
    if (fds.size() == 3 && direct_table_ != nullptr && DirectTable::Attach(fds[2], &table) == 0 &&
        table->pid() == peer.pid && WatchExit(peer)) {
      peer.table_owned = std::move(table);
      peer.table.store(peer.table_owned.get(), std::memory_order_seq_cst);
      if (peer.closed.load(std::memory_order_seq_cst)) peer.table.store(nullptr, std::memory_order_seq_cst);
    }
    fds.erase(fds.begin() + 1);  // the doorbell is the peer's now
  }
  for (int fd : fds) close(fd);
}

void HostDeviceTransport::EncodeForwardHeader(const OutDatagram& dg, uint8_t out[ForwardHeader::kSize]) const {
  ForwardHeader h;
  // The flow the ICRC was sealed for.
  h.src = OutgoingFlowFrom(SenderFor(dg.dst), dg.src_addr, dg.dst, dg.src_port).src;
  h.dst = dg.dst;
  h.icrc_vouched = dg.has_icrc && !dg.altered;
  h.Encode(out);
}

size_t HostDeviceTransport::WriteToRing(Peer& peer, std::span<const OutDatagram> run) {
  size_t written = 0;
  for (const OutDatagram& dg : run) {
    uint8_t header[ForwardHeader::kSize];
    EncodeForwardHeader(dg, header);
    if (!peer.ring->Write(header, dg.payload)) break;
    ++written;
  }
  if (written > 0 && peer.ring->Publish()) SignalEventFd(peer.doorbell);
  return written;
}

size_t HostDeviceTransport::SendToPeer(uint8_t owner, std::span<const OutDatagram> run) {
  run = run.first(std::min<size_t>(run.size(), kBatch));
  size_t sent = 0;
  Peer* peer = PeerFor(owner, false);
  std::unique_lock<std::mutex> lock;
  if (peer != nullptr && same_host_ == SameHostPath::kSharedMemory) {
    // Held through the connection's sendmmsg below too: no packet may go on the connection once another thread has
    // switched to the ring, or the receiver, which takes the connection's packets first, would reorder them.
    lock = std::unique_lock(peer->mu);
    if (!peer->offer_answered) TakeRingOffer(*peer);
    if (peer->ring) {
      sent = WriteToRing(*peer, run);
      ring_sent_.fetch_add(sent, std::memory_order_relaxed);
      if (sent < run.size()) {
        // A full ring: a receiver that stopped taking packets, or one that is gone (its number may come back to a
        // newcomer: connect again next time).
        char byte;
        if (recv(peer->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0) peer->closed.store(true);
      }
      peer_sent_.fetch_add(sent, std::memory_order_relaxed);
      peer_drops_.fetch_add(run.size() - sent, std::memory_order_relaxed);
      return run.size();
    }
  }
  uint8_t headers[kBatch][ForwardHeader::kSize];
  iovec iovs[kBatch][2];
  mmsghdr msgs[kBatch] = {};
  for (size_t k = 0; k < run.size(); ++k) {
    EncodeForwardHeader(run[k], headers[k]);
    iovs[k][0] = {headers[k], ForwardHeader::kSize};
    iovs[k][1] = {const_cast<uint8_t*>(run[k].payload.data()), run[k].payload.size()};
    msgs[k].msg_hdr.msg_iov = iovs[k];
    msgs[k].msg_hdr.msg_iovlen = 2;
  }
  for (bool reconnect : {false, true}) {
    if (reconnect) peer = PeerFor(owner, true);
    if (peer == nullptr) break;
    const int n = sendmmsg(peer->fd, msgs + sent, unsigned(run.size() - sent), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) sent += size_t(n);
    if (sent == run.size()) break;
    // EPIPE / ECONNRESET: that process is gone (its number may come back to a newcomer: connect again once);
    // EAGAIN: its connection is full.
    if (n >= 0 || (errno != EPIPE && errno != ECONNRESET && errno != ENOTCONN)) break;
  }
  peer_sent_.fetch_add(sent, std::memory_order_relaxed);
  peer_drops_.fetch_add(run.size() - sent, std::memory_order_relaxed);
  return run.size();
}

int HostDeviceTransport::Send(std::span<const OutDatagram> batch) {
  size_t i = 0;
  while (i < batch.size()) {
    if (const uint8_t owner = PeerOwner(batch[i]); owner != 0) {
      size_t j = i + 1;
      while (j < batch.size() && PeerOwner(batch[j]) == owner) ++j;
      i += SendToPeer(owner, batch.subspan(i, j - i));
      continue;
    }
    // A run for other hosts that leaves by one transport (SenderFor: one per IP family).
    Transport& sender = SenderFor(batch[i].dst);
    size_t j = i;
    while (j < batch.size() && PeerOwner(batch[j]) == 0 && &SenderFor(batch[j].dst) == &sender) ++j;
    const int r = sender.Send(batch.subspan(i, j - i));
    if (r < 0) return i > 0 ? int(i) : r;
    i += size_t(r);
    if (size_t(r) < j - (i - size_t(r))) return int(i);
  }
  return int(i);
}

// --- direct access (wire/direct_access.h) ------------------------------------------------------------------------

int HostDeviceTransport::ShareXrcSrqs() {
  if (same_host_ != SameHostPath::kSharedMemory) return -ENOTSUP;
  self_pid_ = getpid();  // what we write into other processes' tables beside our owner number
  return direct_table_ != nullptr ? 0 : DirectTable::Create(&direct_table_, &direct_table_fd_);
}

int HostDeviceTransport::EnableDirectAccess() {
  if (int rc = ShareXrcSrqs(); rc < 0) return rc;
  // Under Yama's ptrace_scope 1 only an ancestor may attach to us, and cross-memory attach asks what ptrace would:
  // let the host's other processes in, as Open MPI's shared-memory transport does for the same copies (the kernel's
  // other checks stay: same user, not setuid). Without Yama this fails with EINVAL and nothing is needed.
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  return 0;
}

size_t HostDeviceTransport::direct_peers() {
  std::lock_guard lock(peers_mu_);
  size_t n = 0;
  for (const auto& [owner, peer] : peers_) n += peer->table.load(std::memory_order_relaxed) != nullptr;
  return n;
}

bool HostDeviceTransport::WatchExit(Peer& peer) {
  const int pidfd = int(syscall(SYS_pidfd_open, peer.pid, 0));
  if (pidfd < 0) return errno == ENOSYS;  // a kernel before 5.3: the connection's hang-up only; ESRCH: gone already
  epoll_event e{};
  e.events = EPOLLIN;  // readable once the process has exited
  e.data.u64 = kTagPeer | reinterpret_cast<uint64_t>(&peer);
  peer.pidfd.store(pidfd, std::memory_order_release);  // before it can fire: PeerGone takes it out of our epoll
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, pidfd, &e) < 0) {
    peer.pidfd.store(-1, std::memory_order_release);
    close(pidfd);
    return false;
  }
  return true;
}

void HostDeviceTransport::PeerGone(Peer* peer) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, peer->fd, nullptr);
  if (const int pidfd = peer->pidfd.load(std::memory_order_acquire); pidfd >= 0)
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, pidfd, nullptr);
  peer->closed.store(true, std::memory_order_seq_cst);
  peer->table.store(nullptr, std::memory_order_seq_cst);
  std::lock_guard lock(peers_mu_);
  NoteGoneLocked(peer->owner);  // the hang-up and the pidfd may both report it: once
}

void HostDeviceTransport::NoteGoneLocked(uint8_t owner) {
  if (gone_reported_[owner] || !on_peer_gone_) return;
  gone_reported_[owner] = true;
  gone_queue_.push_back(owner);
  gone_pending_.store(true, std::memory_order_release);
  Wake();
}

void HostDeviceTransport::ReportGone() {
  std::vector<uint8_t> owners;
  {
    std::lock_guard lock(peers_mu_);
    owners.swap(gone_queue_);
    gone_pending_.store(false, std::memory_order_relaxed);
  }
  for (uint8_t owner : owners) on_peer_gone_(owner);
}

DirectTable* HostDeviceTransport::DirectTableFor(const UdpEndpoint& peer, uint32_t dest_qpn, Peer** found) {
  if (!IsHostEndpoint(peer) || direct_refused_.load(std::memory_order_relaxed)) return nullptr;
  return PeerTable(OwnerOf24(dest_qpn), found);
}

DirectTable* HostDeviceTransport::PeerTable(uint8_t owner, Peer** found) {
  if (direct_table_ == nullptr || owner == 0 || IsOurs(owner)) return nullptr;
  Peer* p = PeerFor(owner, false);
  if (p == nullptr) return nullptr;
  DirectTable* table = p->table.load(std::memory_order_acquire);
  if (table == nullptr) {
    std::lock_guard lock(p->mu);
    if (!p->offer_answered) TakeRingOffer(*p);
    table = p->table.load(std::memory_order_acquire);
  }
  *found = p;
  return table;
}

bool HostDeviceTransport::DirectDone(int rc, uint64_t length) {
  if (rc == 1) {
    direct_bytes_.fetch_add(length, std::memory_order_relaxed);
    return true;
  }
  if ((rc == -EPERM || rc == -ENOSYS) && !direct_refused_.exchange(true)) {
    fprintf(stderr,
            "uroce: cross-memory attach refused (%s): RDMA WRITE and READ between processes of this host go as "
            "packets (kernel.yama.ptrace_scope, or a seccomp filter, forbids process_vm_writev)\n",
            strerror(-rc));
  }
  return false;
}

template <typename Copy>
bool HostDeviceTransport::DirectCopy(const UdpEndpoint& peer, uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey,
                                     uint64_t va, uint64_t length, uint32_t right, const Copy& copy) {
  Peer* p = nullptr;
  DirectTable* table = DirectTableFor(peer, dest_qpn, &p);
  if (table == nullptr) return false;
  table->Enter(owner_, self_pid_);
  const uint64_t there = table->Check(dest_qpn, src_qpn, rkey, va, length, right);
  const int rc = there != 0 ? copy(*p, *table, there) : 0;
  table->Leave(owner_);
  return DirectDone(rc, length);
}

bool HostDeviceTransport::Write(const UdpEndpoint& peer, uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey,
                                uint64_t va, std::span<const std::span<const uint8_t>> pieces, uint64_t length) {
  return DirectCopy(peer, dest_qpn, src_qpn, rkey, va, length, direct_rights::kWrite,
                    [&](Peer& p, DirectTable& table, uint64_t there) {
                      return CopyWrite(p, table, rkey, there, pieces, length);
                    });
}

bool HostDeviceTransport::OfferWorthIt(Peer& p, uint64_t now) {
  std::lock_guard lock(p.mu);
  if (!p.ring) return false;
  return !p.ring->ConsumerAsleep() || now - p.last_write_ns.load(std::memory_order_relaxed) < kStreamGapNs;
}

int HostDeviceTransport::CopyWrite(Peer& p, DirectTable& table, uint32_t rkey, uint64_t there,
                                   std::span<const std::span<const uint8_t>> pieces, uint64_t length) {
  const uint64_t now = SystemClock::Instance().NowNs();
  // The halves meet at a page boundary of the target's memory (each side pins whole pages), and the second lies in
  // one piece of ours: the target reads it as one range.
  const uint64_t split = ((there + length / 2 + 4095) & ~uint64_t{4095}) - there;
  constexpr size_t kMaxHead = 64;
  std::span<const uint8_t> head[kMaxHead];
  size_t n = 0;
  uint64_t at = 0;
  const uint8_t* tail = nullptr;
  for (const std::span<const uint8_t>& piece : pieces) {
    if (at >= split || n == kMaxHead) break;
    const uint64_t take = std::min<uint64_t>(piece.size(), split - at);
    head[n++] = piece.first(take);
    at += take;
    if (at == split && take < piece.size() && piece.size() - take == length - split) tail = piece.data() + take;
    if (at == split && take == piece.size()) break;
  }
  if (length < kShareWriteBytes || split >= length || tail == nullptr || !OfferWorthIt(p, now) ||
      !table.OfferCopy(owner_, rkey, reinterpret_cast<uint64_t>(tail), there + split, length - split)) {
    const int rc = CopyToProcess(p.pid, there, pieces, length);
    p.last_write_ns.store(SystemClock::Instance().NowNs(), std::memory_order_relaxed);
    return rc;
  }
  uint8_t record[CopyOffer::kSize];
  CopyOffer{owner_}.Encode(record);
  // No room in its ring: the offer is taken back below at once (unless an earlier notice of ours, still there,
  // made the target take it).
  const bool told = WriteRecord(p, local_, RingRecord::kCopyOffer, record, {}, [] {});
  const int first = CopyToProcess(p.pid, there, {head, n}, split);
  const std::span<const uint8_t> rest[] = {{tail, length - split}};
  int second = 0;
  const uint64_t give_up = SystemClock::Instance().NowNs() + offer_take_ns_;
  for (unsigned spins = 0;; ++spins) {
    const DirectTable::Offer state = table.OfferOf(owner_);
    if (state == DirectTable::Offer::kCopied || state == DirectTable::Offer::kFailed) {
      table.ClearOffer(owner_);
      if (state == DirectTable::Offer::kCopied) {
        second = 1;
        shared_writes_.fetch_add(1, std::memory_order_relaxed);
      } else {
        second = first == 1 ? CopyToProcess(p.pid, there + split, rest, length - split) : 0;
      }
      break;
    }
    if (state == DirectTable::Offer::kOffered &&
        (!told || first != 1 || SystemClock::Instance().NowNs() >= give_up) && table.WithdrawOffer(owner_)) {
      second = first == 1 ? CopyToProcess(p.pid, there + split, rest, length - split) : 0;
      break;
    }
    // Taken: its copy runs on its own (no lock of its device in the way) and ends. Unless the process is gone.
    if (spins % 4096 == 4095 && ProcessGone(p.pid)) {
      second = -ESRCH;
      break;
    }
    // A copy still running after a while may be waiting for our CPU (its thread woken onto it): let it have it.
    if (state == DirectTable::Offer::kTaken && spins >= 1024) sched_yield();
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  p.last_write_ns.store(SystemClock::Instance().NowNs(), std::memory_order_relaxed);
  if (first != 1) return first;
  return second;
}

void HostDeviceTransport::TakeCopyOffer(uint8_t owner) {
  last_offer_ns_.store(SystemClock::Instance().NowNs(), std::memory_order_relaxed);
  uint64_t src = 0, there = 0, length = 0;
  if (direct_table_ == nullptr || !direct_table_->TakeOffer(owner, &src, &there, &length)) return;
  const std::span<uint8_t> into[] = {{reinterpret_cast<uint8_t*>(there), length}};
  const int rc = CopyFromProcess(direct_table_->ProcessOf(owner), src, into, length);
  direct_table_->FinishOffer(owner, rc == 1);
  if (rc == 1) halves_copied_.fetch_add(1, std::memory_order_relaxed);
}

bool HostDeviceTransport::Read(const UdpEndpoint& peer, uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey,
                               uint64_t va, std::span<const std::span<uint8_t>> pieces, uint64_t length) {
  return DirectCopy(peer, dest_qpn, src_qpn, rkey, va, length, direct_rights::kRead,
                    [&](Peer& p, DirectTable&, uint64_t there) {
                      return CopyFromProcess(p.pid, there, pieces, length);
                    });
}

template <typename Written>
bool HostDeviceTransport::WriteRecord(Peer& p, const UdpEndpoint& dst, RingRecord kind,
                                      std::span<const uint8_t> record,
                                      std::span<const std::span<const uint8_t>> pieces, const Written& written) {
  ForwardHeader h;
  h.src = local_;
  h.dst = dst;
  h.record = kind;
  static_assert(DirectSend::kSize <= kMaxRecordBytes && XrcDelivery::kSize <= kMaxRecordBytes);
  uint8_t header[ForwardHeader::kSize + kMaxRecordBytes];
  if (record.size() > kMaxRecordBytes) return false;
  h.Encode(header);
  std::memcpy(header + ForwardHeader::kSize, record.data(), record.size());
  std::lock_guard lock(p.mu);
  // Into the ring only (not a connection that came before it): records must stay in order with one another, behind
  // nothing sent another way.
  if (!p.ring || !p.ring->WriteGathered({header, ForwardHeader::kSize + record.size()}, pieces)) return false;
  written();
  if (p.ring->Publish()) SignalEventFd(p.doorbell);
  return true;
}

bool HostDeviceTransport::SendMessage(const UdpEndpoint& peer, DirectSend& send,
                                      std::span<const std::span<const uint8_t>> pieces, uint64_t length) {
  Peer* p = nullptr;
  DirectTable* table = DirectTableFor(peer, send.dest_qpn, &p);
  if (table == nullptr) return false;
  bool sent = false;
  table->Enter(owner_, self_pid_);
  uint32_t slot = 0;
  if (table->ClaimReceive(&send, length, &slot)) {
    uint8_t record[DirectSend::kSize];
    send.Encode(record);
    // A SEND that does not fit goes as packets. Counted once in the ring (the owner's flush waits for what is
    // counted).
    sent = WriteRecord(*p, peer, RingRecord::kDirectSend, record, pieces, [&] { table->CountSend(slot); });
  }
  table->Leave(owner_);
  if (sent) direct_bytes_.fetch_add(length, std::memory_order_relaxed);
  return sent;
}

void HostDeviceTransport::PublishQp(const QpEntry& qp) {
  if (direct_table_ != nullptr) direct_table_->PublishQp(qp);
}
void HostDeviceTransport::WithdrawQp(uint32_t qpn) {
  if (direct_table_ != nullptr) direct_table_->WithdrawQp(qpn);
}
void HostDeviceTransport::PublishRegion(const Region& region) {
  if (direct_table_ != nullptr) direct_table_->PublishRegion(region);
}
void HostDeviceTransport::WithdrawRegion(uint32_t rkey) {
  if (direct_table_ != nullptr) direct_table_->WithdrawRegion(rkey);
}
void HostDeviceTransport::OpenReceives(uint32_t qpn, uint32_t epoch) {
  if (direct_table_ != nullptr) direct_table_->OpenReceives(qpn, epoch);
}
void HostDeviceTransport::PublishReceives(uint32_t qpn, uint64_t packets_taken, uint64_t first,
                                          std::span<const uint32_t> lengths) {
  if (direct_table_ != nullptr) direct_table_->PublishReceives(qpn, packets_taken, first, lengths);
}
uint64_t HostDeviceTransport::DirectSends(uint32_t qpn) {
  return direct_table_ != nullptr ? direct_table_->DirectSends(qpn) : 0;
}
void HostDeviceTransport::CloseReceives(uint32_t qpn) {
  if (direct_table_ != nullptr) direct_table_->CloseReceives(qpn);
}

bool HostDeviceTransport::PublishXrcSrq(uint32_t srqn, uint64_t domain) {
  return direct_table_ != nullptr && direct_table_->PublishSrq(srqn, domain);
}
uint64_t HostDeviceTransport::XrcWqesClaimed(uint32_t srqn) {
  return direct_table_ != nullptr ? direct_table_->SrqClaimed(srqn) : 0;
}
void HostDeviceTransport::ShowXrcWqes(uint32_t srqn, uint64_t first, std::span<const uint32_t> lengths) {
  if (direct_table_ != nullptr) direct_table_->ShowSrqWqes(srqn, first, lengths);
}
void HostDeviceTransport::WithdrawXrcSrq(uint32_t srqn) {
  if (direct_table_ != nullptr) direct_table_->WithdrawSrq(srqn);
}

DirectTable* HostDeviceTransport::SrqTableFor(uint32_t srqn, Peer** found) {
  if (direct_table_ != nullptr && IsOurs(OwnerOf24(srqn))) return direct_table_.get();
  return PeerTable(OwnerOf24(srqn), found);  // SRQ numbers carry their owner's number as QPNs do
}

int HostDeviceTransport::XrcSrqInDomain(uint32_t srqn, uint64_t domain) {
  Peer* p = nullptr;
  if (DirectTable* table = SrqTableFor(srqn, &p)) return table->SrqInDomain(srqn, domain);
  if (p == nullptr) return 0;  // no such process (now)
  // Connected just now (a target's first message for a process it never talked to): its polling thread has not yet
  // accepted us and offered its ring and table.
  std::lock_guard lock(p->mu);
  return p->offer_answered ? 0 : -EAGAIN;
}

bool HostDeviceTransport::ClaimXrcWqe(uint32_t srqn, uint64_t* index, uint32_t* length) {
  Peer* p = nullptr;
  DirectTable* table = SrqTableFor(srqn, &p);
  return table != nullptr && table->ClaimSrqWqe(srqn, index, length);
}

bool HostDeviceTransport::DeliverXrc(const XrcDelivery& delivery, std::span<const uint8_t> bytes) {
  Peer* p = nullptr;
  if (PeerTable(OwnerOf24(delivery.srqn), &p) == nullptr) return false;
  uint8_t record[XrcDelivery::kSize];
  delivery.Encode(record);
  const std::span<const uint8_t> pieces[] = {bytes};
  return WriteRecord(*p, local_, RingRecord::kXrcDelivery, record, pieces, [] {});
}

bool HostDeviceTransport::PublishXrcTarget(uint32_t qpn, uint64_t domain, std::span<const uint8_t> attributes,
                                           const uint64_t* holders) {
  return direct_table_ != nullptr && direct_table_->PublishTarget(qpn, domain, attributes, holders);
}

DirectTable* HostDeviceTransport::LastTableOf(uint8_t owner) {
  std::lock_guard lock(peers_mu_);
  if (auto it = peers_.find(owner); it != peers_.end() && it->second->table_owned) return it->second->table_owned.get();
  for (auto it = retired_.rbegin(); it != retired_.rend(); ++it)
    if ((*it)->owner == owner && (*it)->table_owned) return (*it)->table_owned.get();
  return nullptr;
}

bool HostDeviceTransport::ReadGoneXrcTarget(uint32_t qpn, std::span<uint8_t> attributes, uint64_t holders[4]) {
  // The table stays mapped after its process is gone (Peer::table_owned), so its last state can be read.
  DirectTable* table = LastTableOf(OwnerOf24(qpn));
  if (direct_table_ == nullptr || table == nullptr || !table->TargetHolders(qpn, holders) ||
      !table->ReadTarget(qpn, attributes))
    return false;
  // The holders' pids come along into our table, which will count their bits (ReleaseTarget looks at them).
  for (int n = 1; n < 256; ++n)
    if (HasHolder(holders, n)) direct_table_->NoteProcess(uint8_t(n), table->ProcessOf(uint8_t(n)));
  return true;
}

int HostDeviceTransport::AdoptOwner(uint8_t owner) {
  if (owner == 0 || owner == owner_) return -EINVAL;
  if (adopted_[owner].load(std::memory_order_acquire)) return 0;
  if (!adopt_owner_) return -ENOTSUP;
  if (int err = adopt_owner_(owner)) return -err;
  // The gone process's name is free once its listener closed: the host's processes that send to its QPNs connect
  // to it again and reach us.
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_un sun;
  const socklen_t len = AbstractUnixAddress(HostDevicePeerName(local_.addr, owner), &sun);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&sun), len) < 0 || listen(fd, SOMAXCONN) < 0) {
    const int err = errno;
    if (fd >= 0) close(fd);
    return -err;  // the number is ours at the service, but only packets from other hosts would reach us
  }
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.u64 = kTagAdoptedListen | uint64_t(fd);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &e);
  adopted_listen_fds_.push_back(fd);
  adopted_[owner].store(true, std::memory_order_release);
  return 0;
}
bool HostDeviceTransport::ReleaseXrcTarget(uint32_t qpn) {
  return direct_table_ == nullptr || direct_table_->ReleaseTarget(qpn);
}
void HostDeviceTransport::WithdrawXrcTarget(uint32_t qpn) {
  if (direct_table_ != nullptr) direct_table_->WithdrawTarget(qpn);
}

DirectTable* HostDeviceTransport::TableOf(uint8_t owner, bool* unanswered, Peer** found) {
  Peer* p = nullptr;
  DirectTable* table = PeerTable(owner, &p);
  if (found != nullptr) *found = p;
  if (table != nullptr || p == nullptr) return table;
  // Connected just now (never before, or again: its number went to the process that took it over): its polling
  // thread accepts us and offers its ring and table.
  std::lock_guard lock(p->mu);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(kOpenWaitMs);
  while (!p->offer_answered && std::chrono::steady_clock::now() < give_up) {
    pollfd w{p->fd, POLLIN, 0};
    poll(&w, 1, 10);
    TakeRingOffer(*p);
  }
  if (unanswered != nullptr) *unanswered = !p->offer_answered;
  return p->table.load(std::memory_order_acquire);
}

void HostDeviceTransport::TellXrcTargetHolders(uint32_t qpn, uint8_t event) {
  uint64_t holders[4];
  if (direct_table_ == nullptr || !direct_table_->TargetHolders(qpn, holders)) return;
  uint8_t record[XrcTargetEvent::kSize];
  XrcTargetEvent{qpn, event}.Encode(record);
  for (unsigned n = 1; n < 256; ++n) {
    if (!HasHolder(holders, n) || IsOurs(uint8_t(n))) continue;
    // A holder we never sent to yet: connected now, its ring offered within kOpenWaitMs (it connected to us to
    // open the QP, so it runs and answers).
    Peer* p = nullptr;
    if (TableOf(uint8_t(n), nullptr, &p) != nullptr)
      WriteRecord(*p, local_, RingRecord::kXrcTargetEvent, record, {}, [] {});
  }
}

int HostDeviceTransport::ModifyXrcTarget(uint32_t qpn, std::span<const uint8_t> attributes, uint32_t mask) {
  const uint8_t owner = OwnerOf24(qpn);
  bool unanswered = false;
  Peer* p = nullptr;
  if (TableOf(owner, &unanswered, &p) == nullptr) return unanswered ? EAGAIN : EINVAL;
  XrcTargetModify m;
  m.qpn = qpn;
  m.mask = mask;
  m.from = owner_;
  {
    std::lock_guard lock(modify_mu_);
    m.request = next_modify_++;
  }
  uint8_t record[XrcTargetModify::kSize];
  m.Encode(record);
  const std::span<const uint8_t> pieces[] = {attributes};
  if (!WriteRecord(*p, local_, RingRecord::kXrcTargetModify, record, pieces, [] {})) return EAGAIN;
  std::unique_lock lock(modify_mu_);
  if (!modify_answered_.wait_for(lock, std::chrono::milliseconds(kOpenWaitMs),
                                 [&] { return modify_answers_.count(m.request) != 0; })) {
    return EAGAIN;  // (a late answer stays in the map: one int)
  }
  const int result = modify_answers_[m.request];
  modify_answers_.erase(m.request);
  return result;
}

bool HostDeviceTransport::HoldsXrcTarget(uint32_t qpn, uint8_t owner) {
  uint64_t holders[4];
  return direct_table_ != nullptr && direct_table_->TargetHolders(qpn, holders) && HasHolder(holders, owner);
}

void HostDeviceTransport::AnswerXrcTargetModify(uint8_t owner, uint32_t request, int result) {
  Peer* p = nullptr;
  if (TableOf(owner, nullptr, &p) == nullptr) return;  // gone: nobody waits
  XrcTargetModify m;
  m.request = request;
  m.result = result;
  m.from = owner_;
  m.answer = true;
  uint8_t record[XrcTargetModify::kSize];
  m.Encode(record);
  WriteRecord(*p, local_, RingRecord::kXrcTargetModify, record, {}, [] {});
}

void HostDeviceTransport::ExportPd(uint32_t handle) {
  if (direct_table_ != nullptr) direct_table_->ExportPd(handle);
}
void HostDeviceTransport::WithdrawPd(uint32_t handle) {
  if (direct_table_ != nullptr) direct_table_->WithdrawPd(handle);
}
void HostDeviceTransport::ExportRegion(const ExportedRegion& region) {
  if (direct_table_ != nullptr) direct_table_->ExportRegion(region);
}
void HostDeviceTransport::WithdrawExportedRegion(uint32_t lkey) {
  if (direct_table_ != nullptr) direct_table_->WithdrawExportedRegion(lkey);
}

int HostDeviceTransport::ImportablePd(uint8_t owner, uint32_t handle) {
  bool unanswered = false;
  DirectTable* table = TableOf(owner, &unanswered);
  if (unanswered) return -EAGAIN;
  return table != nullptr && table->HasPd(handle) ? 0 : -EINVAL;
}

int HostDeviceTransport::ImportableRegion(uint8_t owner, uint32_t handle, ExportedRegion* out) {
  bool unanswered = false;
  DirectTable* table = TableOf(owner, &unanswered);
  if (unanswered) return -EAGAIN;
  return table != nullptr && table->FindExportedRegion(handle, out) ? 0 : -EINVAL;
}

template <typename Copy>
bool HostDeviceTransport::ExportedCopy(uint8_t owner, uint32_t lkey, uint64_t there, size_t n, const Copy& copy) {
  DirectTable* table = TableOf(owner, nullptr);
  if (table == nullptr) return false;
  // Between Enter and Leave the region stays exported: its process's deregistration waits for us to leave.
  table->Enter(owner_, self_pid_);
  const int rc = table->Exported(lkey, there, n) ? copy(table->pid()) : 0;
  table->Leave(owner_);
  return rc == 1;
}

bool HostDeviceTransport::ReadExported(uint8_t owner, uint32_t lkey, uint64_t there, void* into, size_t n) {
  const std::span<uint8_t> piece(static_cast<uint8_t*>(into), n);
  return ExportedCopy(owner, lkey, there, n, [&](pid_t pid) { return CopyFromProcess(pid, there, {&piece, 1}, n); });
}

bool HostDeviceTransport::WriteExported(uint8_t owner, uint32_t lkey, uint64_t there, const void* from, size_t n) {
  const std::span<const uint8_t> piece(static_cast<const uint8_t*>(from), n);
  return ExportedCopy(owner, lkey, there, n, [&](pid_t pid) { return CopyToProcess(pid, there, {&piece, 1}, n); });
}

int HostDeviceTransport::OpenXrcTarget(uint32_t qpn, uint64_t domain) {
  bool unanswered = false;
  DirectTable* table = TableOf(OwnerOf24(qpn), &unanswered);
  if (unanswered) return -EAGAIN;
  if (table == nullptr) return -EINVAL;  // no such process, or none whose table we may use
  return table->OpenTarget(qpn, domain, owner_, self_pid_) ? 0 : -EINVAL;
}

bool HostDeviceTransport::ReadXrcTarget(uint32_t qpn, std::span<uint8_t> attributes) {
  DirectTable* table = TableOf(OwnerOf24(qpn), nullptr);
  return table != nullptr && table->ReadTarget(qpn, attributes);
}

void HostDeviceTransport::CloseXrcTarget(uint32_t qpn) {
  if (DirectTable* table = TableOf(OwnerOf24(qpn), nullptr)) table->CloseTarget(qpn, owner_);
}

}  // namespace uroce::wire
