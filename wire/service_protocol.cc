#include "wire/service_protocol.h"

#include <linux/filter.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <type_traits>
#include <variant>

#include "wire/cm_mad.h"
#include "wire/headers.h"

namespace uroce::wire {

namespace {

// The UD packet QP1's MADs travel in: BTH, DETH, the 256-byte MAD (IBTA 13.4.2), ICRC.
constexpr size_t kMadOffset = Bth::kSize + Deth::kSize;

PacketRoute ToOwner(uint8_t owner) {
  if (owner == 0) return {};
  return {PacketRoute::Kind::kOwner, owner, 0};
}

PacketRoute RouteOfMad(std::span<const uint8_t> packet) {
  if (packet.size() < kMadOffset + kMadSize) return {};
  auto mad = ParseCmMad(packet.subspan(kMadOffset, kMadSize));
  if (!mad) return {};
  return std::visit(
      [](const auto& m) -> PacketRoute {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, CmReq> || std::is_same_v<M, CmSidrReq>) {
          return {PacketRoute::Kind::kListener, 0, m.service_id};
        } else if constexpr (std::is_same_v<M, CmSidrRep>) {
          return ToOwner(OwnerOf32(m.request_id));
        } else {
          return ToOwner(OwnerOf32(m.remote_comm_id));
        }
      },
      mad.value().message);
}

void PutEndpoint(const UdpEndpoint& ep, uint8_t* out) {
  std::memcpy(out, ep.addr.bytes().data(), 16);
  out[16] = static_cast<uint8_t>(ep.port >> 8);
  out[17] = static_cast<uint8_t>(ep.port);
}

UdpEndpoint GetEndpoint(const uint8_t* in) {
  return {IpAddress::FromBytes(in), static_cast<uint16_t>(in[16] << 8 | in[17])};
}

}  // namespace

PacketRoute RouteOf(std::span<const uint8_t> packet) {
  if (packet.size() < Bth::kSize) return {};
  const uint32_t qpn = Bth::Decode(packet.data()).dest_qp;
  if (qpn == kGsiQpn) return RouteOfMad(packet);
  if (qpn == kMulticastQpn) return {};  // delivered by each process's own multicast receiver, never by the service
  return ToOwner(OwnerOf24(qpn));
}

int AttachOwnerSteering(int fd, const std::array<uint16_t, 256>& index_of_owner) {
  // A = the BTH's DestQP (payload bytes 5..7: a 32-bit load at 4, whose top byte is reserved); the multicast QPN
  // (never an owner's) and every owner without a socket: 0. Then one test per owner that has one.
  std::vector<sock_filter> code = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4),
      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xffffff),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kMulticastQpn, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, 0),
      BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 16),
  };
  for (unsigned owner = 1; owner < 256; ++owner) {
    if (index_of_owner[owner] == 0) continue;
    code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, owner, 0, 1));
    code.push_back(BPF_STMT(BPF_RET | BPF_K, index_of_owner[owner]));
  }
  code.push_back(BPF_STMT(BPF_RET | BPF_K, 0));
  const sock_fprog prog{static_cast<unsigned short>(code.size()), code.data()};
  return setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) == 0 ? 0 : -errno;
}

// Layout: version u8 | flags u8 (bit 0: congestion experienced, 1: ICRC vouched, 2-5: the RingRecord) | reserved u16
// | src (16 address bytes, port u16) | dst (the same) | reserved u16.
void ForwardHeader::Encode(uint8_t out[kSize]) const {
  std::memset(out, 0, kSize);
  out[0] = 1;
  out[1] = (congestion_experienced ? 1 : 0) | (icrc_vouched ? 2 : 0) | (static_cast<uint8_t>(record) << 2);
  PutEndpoint(src, out + 4);
  PutEndpoint(dst, out + 22);
}

std::optional<ForwardHeader> ForwardHeader::Decode(std::span<const uint8_t> in) {
  if (in.size() < kSize || in[0] != 1) return std::nullopt;
  ForwardHeader h;
  h.congestion_experienced = (in[1] & 1) != 0;
  h.icrc_vouched = (in[1] & 2) != 0;
  const uint8_t record = (in[1] >> 2) & 15;
  if (record > static_cast<uint8_t>(kLastRingRecord) || (in[1] >> 6) != 0) return std::nullopt;
  h.record = static_cast<RingRecord>(record);
  h.src = GetEndpoint(in.data() + 4);
  h.dst = GetEndpoint(in.data() + 22);
  return h;
}

void ControlMessage::Encode(uint8_t out[kControlSize]) const {
  std::memset(out, 0, kControlSize);
  const uint16_t version = kControlVersion;
  const auto t = static_cast<uint16_t>(type);
  std::memcpy(out, &kControlMagic, 4);
  std::memcpy(out + 4, &version, 2);
  std::memcpy(out + 6, &t, 2);
  std::memcpy(out + 8, &status, 4);
  std::memcpy(out + 16, &value, 8);
}

std::optional<ControlMessage> ControlMessage::Decode(std::span<const uint8_t> in) {
  if (in.size() != kControlSize) return std::nullopt;
  uint32_t magic;
  uint16_t version, t;
  std::memcpy(&magic, in.data(), 4);
  std::memcpy(&version, in.data() + 4, 2);
  std::memcpy(&t, in.data() + 6, 2);
  if (magic != kControlMagic || version != kControlVersion) return std::nullopt;
  if (t < static_cast<uint16_t>(ControlType::kHello) || t > static_cast<uint16_t>(ControlType::kAdoptOwner)) {
    return std::nullopt;
  }
  ControlMessage m;
  m.type = static_cast<ControlType>(t);
  std::memcpy(&m.status, in.data() + 8, 4);
  std::memcpy(&m.value, in.data() + 16, 8);
  return m;
}

int SendControl(int fd, const ControlMessage& m, std::span<const int> passed_fds, int flags) {
  if (passed_fds.size() > kMaxPassedFds) return -EINVAL;
  uint8_t bytes[kControlSize];
  m.Encode(bytes);
  iovec iov{bytes, sizeof bytes};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!passed_fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * passed_fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * passed_fds.size());
    std::memcpy(CMSG_DATA(c), passed_fds.data(), sizeof(int) * passed_fds.size());
  }
  return sendmsg(fd, &msg, flags | MSG_NOSIGNAL) < 0 ? -errno : 0;
}

int SendControl(int fd, const ControlMessage& m, int passed_fd, int flags) {
  return passed_fd >= 0 ? SendControl(fd, m, std::span<const int>(&passed_fd, 1), flags)
                        : SendControl(fd, m, std::span<const int>(), flags);
}

int TakeControl(int fd, ControlMessage* out, std::vector<int>* fds) {
  uint8_t bytes[kControlSize + 1];
  iovec iov{bytes, sizeof bytes};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  while ((n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  if (n < 0) return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  fds->clear();
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int passed;
      std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof passed);
      fds->push_back(passed);
    }
  }
  if (n == 0) {  // SOCK_SEQPACKET: the other end closed
    for (int passed : *fds) close(passed);
    fds->clear();
    return -ENOTCONN;
  }
  auto m = ControlMessage::Decode({bytes, size_t(n)});
  if (!m || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    for (int passed : *fds) close(passed);
    fds->clear();
    return -EPROTO;
  }
  *out = *m;
  return 0;
}

UntakenDescriptors::~UntakenDescriptors() {
  for (int fd : fds_) {
    if (fd >= 0) close(fd);
  }
}

int ReceiveControl(int fd, int timeout_ms, ControlMessage* out, std::vector<int>* fds) {
  pollfd p{fd, POLLIN, 0};
  int r;
  while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  if (r == 0) return -ETIMEDOUT;
  std::vector<int> passed;
  const int rc = TakeControl(fd, out, &passed);
  if (fds != nullptr && rc == 0) {
    *fds = std::move(passed);
  } else {
    for (int f : passed) close(f);
  }
  if (rc == -EPROTO) return -EPROTO;
  return rc < 0 ? -EAGAIN : 0;
}

std::string DeviceServiceName(const IpAddress& address) { return "uroce/device/v1/" + address.ToString(); }

std::string HostDevicePeerName(const IpAddress& address, uint8_t owner) {
  return DeviceServiceName(address) + "/" + std::to_string(owner);
}

}  // namespace uroce::wire
