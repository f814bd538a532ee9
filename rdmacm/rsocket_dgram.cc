// Datagram rsockets (rsocket.h). Each is a UD QP on the process's device, bound to (port space kDgramPortSpace,
// port) in the host's registry with its QPN as the tag, so a sender on this host finds the QP behind an ip:port. A
// datagram carries kDgramHeader bytes first: the sender's port (be16), its address family, and its device's
// address, from which rrecvfrom builds the source address the application replies to.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "rdmacm/internal.h"
#include "rdmacm/rsocket.h"

namespace uroce::rdmacm::rsockets {
namespace {

constexpr uint16_t kDgramPortSpace = kRsocketDatagramPortSpace;
constexpr size_t kDgramHeader = 20;
constexpr size_t kGrh = 40;
// A datagram rsocket's receive queue: a UD receiver without a posted receive drops, and udpong's echo client, which
// resends after 1 ms without an answer, filled 32 receives with the answers' duplicates on a busy machine; once the
// one copy of its current request was dropped it resent only older ones, forever.
constexpr int kDgramSlots = 256;

bool ThisHost(const sockaddr* sa) { return IsAnyOrLoopback(sa); }

// The process's device (GID 0), and the largest datagram its port's MTU carries. 0 or ENODEV.
int FindDevice(RSocket* rs, ibv_context** verbs) {
  int n = 0;
  ibv_context** devices = rdma_get_devices(&n);
  if (devices == nullptr || n == 0) {
    rdma_free_devices(devices);
    return ENODEV;
  }
  *verbs = devices[0];
  rdma_free_devices(devices);
  ibv_gid gid{};
  if (ibv_query_gid(*verbs, 1, 0, &gid) != 0) return ENODEV;
  rs->datagram.device = wire::IpAddress::FromBytes(gid.raw);
  ibv_port_attr port{};
  if (ibv_query_port(*verbs, 1, &port) != 0) return ENODEV;
  rs->datagram.max_dgram = (size_t{128} << port.active_mtu) - kDgramHeader;  // IB MTU enum: 1 = 256 ... 5 = 4096
  return 0;
}

// The UD QP, in RTS. 0 or errno.
int CreateUdQp(RSocket* rs) {
  ibv_qp_init_attr attr{};
  attr.send_cq = attr.recv_cq = rs->cq;
  attr.qp_type = IBV_QPT_UD;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = rs->slots;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.sq_sig_all = 1;
  ibv_qp* qp = rs->datagram.qp = ibv_create_qp(rs->datagram.pd, &attr);
  if (qp == nullptr) return errno ? errno : ENOMEM;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qkey = RDMA_UDP_QKEY;
  int err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  if (!err) err = ibv_modify_qp(qp, &a, IBV_QP_STATE);
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  if (!err) err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
  return err;
}

// Binds the datagram rsocket to `port` (0: an ephemeral one) and publishes its QPN. 0 or errno.
int BindPort(RSocket* rs, uint16_t port) {
  DatagramState& d = rs->datagram;
  if (d.binding.bound()) return EINVAL;
  if (int err = d.binding.Bind(kDgramPortSpace, port)) return err;
  return d.binding.Publish(d.device, d.qp->qp_num);
}

// Who holds datagram port `port` on this host: the owner looked up before while the name it published stands (one
// system call), else the registry's answer (a listing of the host's UNIX sockets).
std::optional<PortOwner> OwnerOf(RSocket* rs, uint16_t port) {
  DatagramState& d = rs->datagram;
  if (auto it = d.owners.find(port); it != d.owners.end()) {
    if (d.owner_probe.StillPublished(kDgramPortSpace, port, it->second)) return it->second;
    d.owners.erase(it);
  }
  auto owner = FindPortOwnerWithTag(kDgramPortSpace, port);
  if (owner && owner->tag) d.owners[port] = *owner;
  return owner;
}

// The address handle for `owner`'s device, made on first use; nullptr (errno set) when none can be made.
ibv_ah* AhFor(RSocket* rs, const PortOwner& owner) {
  ibv_ah*& ah = rs->datagram.ahs[{owner.device, *owner.tag}];
  if (ah == nullptr) {
    ibv_ah_attr a{};
    a.is_global = 1;
    std::memcpy(a.grh.dgid.raw, owner.device.bytes().data(), 16);
    a.grh.hop_limit = 64;
    a.port_num = 1;
    ah = ibv_create_ah(rs->datagram.pd, &a);
  }
  return ah;
}

// Posts `buf` behind our header from send slot `slot` to `owner`'s QP. 0 or errno (the slot is then free again).
int PostDatagram(RSocket* rs, int slot, const void* buf, size_t len, ibv_ah* ah, uint32_t remote_qpn) {
  const DatagramState& d = rs->datagram;
  uint8_t* out = rs->send_buf.data() + size_t(slot) * rs->slot_bytes;
  const uint16_t port = htons(d.binding.port());
  std::memcpy(out, &port, 2);
  out[2] = d.device.is_v4() ? 4 : 6;
  out[3] = 0;
  std::memcpy(out + 4, d.device.bytes().data(), 16);
  std::memcpy(out + kDgramHeader, buf, len);
  ibv_sge sge{reinterpret_cast<uintptr_t>(out), uint32_t(kDgramHeader + len), rs->send_mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = uint32_t(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = remote_qpn;
  wr.wr.ud.remote_qkey = RDMA_UDP_QKEY;
  const int err = ibv_post_send(d.qp, &wr, &bad);
  if (err) rs->free_send.push_back(slot);
  return err;
}

}  // namespace

int DgramSetUp(RSocket* rs) {
  ibv_context* verbs = nullptr;
  if (int err = FindDevice(rs, &verbs)) return err;
  rs->slots = kDgramSlots;
  rs->slot_bytes = uint32_t(kGrh + kDgramHeader + rs->datagram.max_dgram);
  rs->datagram.pd = ibv_alloc_pd(verbs);
  if (rs->datagram.pd == nullptr) return errno ? errno : ENOMEM;
  if (int err = CreateCq(rs, verbs)) return err;
  if (int err = CreateUdQp(rs)) return err;
  return SetUpBuffers(rs, rs->datagram.pd);
}

void DgramTearDown(RSocket* rs) {
  DatagramState& d = rs->datagram;
  for (auto& [key, ah] : d.ahs) ibv_destroy_ah(ah);
  d.ahs.clear();
  if (d.qp) ibv_destroy_qp(d.qp);
  if (rs->recv_mr) ibv_dereg_mr(rs->recv_mr);
  if (rs->send_mr) ibv_dereg_mr(rs->send_mr);
  if (rs->cq) ibv_destroy_cq(rs->cq);
  DestroyCqChannel(rs);
  if (d.pd) ibv_dealloc_pd(d.pd);
  d.qp = nullptr;
  rs->recv_mr = rs->send_mr = nullptr;
  rs->cq = nullptr;
  d.pd = nullptr;
  d.binding.Release();
}

int DgramBind(RSocket* rs, const sockaddr* addr) {
  if (!ThisHost(addr) && wire::IpAddressOf(addr) != rs->datagram.device) return EADDRNOTAVAIL;
  return BindPort(rs, PortOfSockaddr(addr));
}

// A datagram rsocket only remembers its default destination (and gets a port).
int DgramConnect(RSocket* rs, const sockaddr* addr, socklen_t addrlen) {
  sockaddr_storage dst{};
  std::memcpy(&dst, addr, std::min<size_t>(addrlen, sizeof dst));
  rs->datagram.peer = dst;
  if (!rs->datagram.binding.bound())
    if (int err = BindPort(rs, 0)) return err;
  return 0;
}

void OnDatagramCompletion(RSocket* rs, const ibv_wc& wc) {
  if (!TookSendOrFailure(rs, wc)) rs->ready.emplace_back(int(wc.wr_id & 0xFFFFFFFF), wc.byte_len);
}

ssize_t DgramSend(RSocket* rs, std::unique_lock<std::mutex>& lock, const void* buf, size_t len, int flags,
                  const sockaddr* dst) {
  DatagramState& d = rs->datagram;
  if (dst == nullptr) return Fail<ssize_t>(EDESTADDRREQ);
  if (len > d.max_dgram) return Fail<ssize_t>(EMSGSIZE);
  if (!d.binding.bound())
    if (int err = BindPort(rs, 0)) return Fail<ssize_t>(err);
  // Only rsockets of this host are reachable: their device and QPN are in the registry under the port.
  if (!ThisHost(dst) && wire::IpAddressOf(dst) != d.device) return Fail<ssize_t>(EHOSTUNREACH);
  const auto owner = OwnerOf(rs, PortOfSockaddr(dst));
  if (!owner || !owner->tag) {
    // Nobody holds that port. As UDP's sendto(2), the datagram is lost without an error (udpong's server answers
    // clients that may have gone: it exited on our ECONNREFUSED); a connected socket is told, as UDP's is once the
    // ICMP port unreachable is back.
    const bool connected = d.peer && dst == reinterpret_cast<const sockaddr*>(&*d.peer);
    return connected ? Fail<ssize_t>(ECONNREFUSED) : ssize_t(len);
  }
  ibv_ah* ah = AhFor(rs, *owner);
  if (ah == nullptr) return -1;
  const int slot = TakeSendSlot(rs, lock, !rs->nonblocking && !(flags & MSG_DONTWAIT), /*needs_credit=*/false);
  if (slot < 0) return Fail<ssize_t>(-slot);
  if (int err = PostDatagram(rs, slot, buf, len, ah, *owner->tag)) return Fail<ssize_t>(err);
  return ssize_t(len);
}

ssize_t DgramRecv(RSocket* rs, std::unique_lock<std::mutex>& lock, void* buf, size_t len, int flags, sockaddr* src,
                  socklen_t* srclen) {
  const bool wait = !rs->nonblocking && !(flags & MSG_DONTWAIT);
  PollCq(rs);
  if (rs->ready.empty()) {
    if (!wait) return Fail<ssize_t>(EAGAIN);
    if (!WaitUntil(rs, lock, [&] {
          PollCq(rs);
          return !rs->ready.empty();
        }))
      return Fail<ssize_t>(EBADF);  // closed meanwhile
  }
  const auto [slot, bytes] = rs->ready.front();
  rs->ready.pop_front();
  const uint8_t* in = rs->recv_buf.data() + size_t(slot) * rs->slot_bytes + kGrh;
  const size_t payload = bytes >= kGrh + kDgramHeader ? bytes - kGrh - kDgramHeader : 0;
  const size_t n = std::min(len, payload);  // the rest of a longer datagram is discarded, as UDP's
  std::memcpy(buf, in + kDgramHeader, n);
  if (src && srclen) {
    uint16_t port;
    std::memcpy(&port, in, 2);
    sockaddr_storage ss{};
    SetSockaddr(&ss, wire::IpAddress::FromBytes(in + 4), ntohs(port), rs->family);
    const socklen_t want = rs->family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(src, &ss, std::min(*srclen, want));
    *srclen = want;
  }
  PostRecv(rs, slot);
  return ssize_t(n);
}

}  // namespace uroce::rdmacm::rsockets
