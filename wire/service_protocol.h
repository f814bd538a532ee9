// The bytes between the host's device service and the processes that share its device (docs/ARCHITECTURE.md, "The
// host device"): the owner byte in identifiers that routes a packet to its process, the header of a datagram the
// service forwards, and the control messages on the service's UNIX socket.
//
// One device per host (per network namespace) means one UDP 4791 per address, held by the service; each process runs
// its own engine. A process is given an owner number (1..255) when it joins, and numbers what a peer addresses with it:
// QPNs and XRC SRQ numbers are owner << 16 | n (24 bits, as the BTH DestQP and the XRCETH carry them), CM comm IDs
// and SIDR request IDs owner << 24 | n. So the service routes an arriving packet by one field of its headers, with no
// table per QP: a data packet by its BTH DestQP, a CM MAD on QP1 by the comm ID it names as the receiver's (REP, RTU,
// REJ, MRA, DREQ, DREP: "remote comm ID"; SIDR REP: request ID) or, for a new REQ or SIDR REQ, by its service ID, which
// the listening process registered (kListen).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "wire/address.h"
#include "wire/transport.h"

namespace uroce::wire {

// Owner numbers: 0 is "no service" (a device that owns its address alone), 1..255 are processes.
inline constexpr unsigned kMaxOwners = 255;
inline constexpr uint32_t WithOwner24(uint8_t owner, uint32_t n) { return uint32_t{owner} << 16 | (n & 0xffff); }
inline constexpr uint32_t WithOwner32(uint8_t owner, uint32_t n) { return uint32_t{owner} << 24 | (n & 0xffffff); }
inline constexpr uint8_t OwnerOf24(uint32_t qpn) { return static_cast<uint8_t>(qpn >> 16); }
inline constexpr uint8_t OwnerOf32(uint32_t comm_id) { return static_cast<uint8_t>(comm_id >> 24); }

// Where an arriving RoCEv2 packet (UDP payload: BTH .. ICRC) goes.
struct PacketRoute {
  enum class Kind : uint8_t {
    kOwner,      // to the process with `owner`
    kListener,   // a new connection: to whoever listens on `service_id`
    kUnroutable  // too short, a MAD that names no one, a multicast QPN: dropped (counted)
  };
  Kind kind = Kind::kUnroutable;
  uint8_t owner = 0;
  uint64_t service_id = 0;
};
PacketRoute RouteOf(std::span<const uint8_t> packet);

// Steering of arriving packets by the kernel (the service's design for packets from other hosts): the service and
// each of its processes have a UDP socket bound to the device's address:4791 in one SO_REUSEPORT group, and a classic
// BPF program of the group (SO_ATTACH_REUSEPORT_CBPF) picks the socket of a packet's owner: the top byte of its BTH
// DestQP (UDP payload byte 5) when `index_of_owner` gives it a socket (its index in the group: the order the sockets
// were bound in), else index 0 (the service's, which routes what is left: CM MADs, owners without a socket). A packet
// too short to have a BTH also goes to 0 (the program's load fails: it returns 0). Attached through `fd`, any socket of
// the group. 0, or -errno of setsockopt (-EINVAL: a kernel without it).
int AttachOwnerSteering(int fd, const std::array<uint16_t, 256>& index_of_owner);

// The header in front of each datagram the service forwards to a process: the addresses the packet had on the wire
// (the ICRC covers them, and a UD receive reports the source), and whether the service's socket was congested. The
// same header is in front of each datagram one process hands another. Layout: version u8 (1) | flags u8 (1:
// congestion experienced, 2: ICRC vouched for) | 2 reserved | source endpoint | destination endpoint.
struct ForwardHeader {
  static constexpr size_t kSize = 40;
  UdpEndpoint src;
  UdpEndpoint dst;
  bool congestion_experienced = false;
  // Set by a process of this host on what it sends another: it sealed the ICRC and nothing altered the packet since
  // (InDatagram::icrc_vouched). Never set on what the service forwards from the network.
  bool icrc_vouched = false;
  // What follows (InDatagram::record): a packet, or a record only ever found in a process's ring.
  RingRecord record = RingRecord::kPacket;

  void Encode(uint8_t out[kSize]) const;
  // nullopt for a header that is not one (wrong version, short).
  static std::optional<ForwardHeader> Decode(std::span<const uint8_t> in);
};

// Control messages on the service's SOCK_SEQPACKET socket, one per packet, all kControlSize bytes:
//   magic u32 | version u16 | type u16 | status i32 (0 or an errno) | reserved u32 | value u64   (host byte order:
//   both ends are on one host).
inline constexpr uint32_t kControlMagic = 0x75724456;  // "urDV"
inline constexpr uint16_t kControlVersion = 1;
inline constexpr size_t kControlSize = 24;
enum class ControlType : uint16_t {
  kHello = 1,     // process -> service, with SCM_RIGHTS: the datagram socket to forward on; value = pid
  // service -> process: status, value = owner number | kWelcomeEveryAddress when the service receives on every
  // address of the host too (the device's GID table lists them) | kWelcomeGidTable when it shares that table; with
  // SCM_RIGHTS, in this order: the table (wire::SharedGidTable's memfd) when kWelcomeGidTable says so, and, when
  // the kernel steers (AttachOwnerSteering), the process's own UDP socket on the service's address:4791, where its
  // packets from other hosts arrive
  kWelcome = 2,
  kListen = 3,    // process -> service: route REQs for service ID `value` to me
  kUnlisten = 4,  // process -> service: no longer
  kReply = 5,     // service -> process: status of a kListen / kUnlisten
  // process -> process, on a peer connection (wire/host_device_transport.h), from the receiving end: value = the
  // ring's data bytes; with SCM_RIGHTS: the PacketRing's memfd and the receiver's doorbell (an eventfd).
  kRingOffer = 6,
  // process -> service, once it receives on the UDP socket the welcome brought: steer my packets there from now on
  // (kReply: 0, or EINVAL when it was given none)
  kSteer = 7,
  // process -> service: the process of owner number `value` is gone and we hold XRC target QPs of it: route
  // what is for its number to us from now on, until we leave (kReply: 0; EAGAIN: its process has not left yet, ask
  // again; EALREADY: another process took it; EINVAL: not a number that may be taken)
  kAdoptOwner = 8,
};
inline constexpr uint64_t kWelcomeEveryAddress = uint64_t{1} << 32;
inline constexpr uint64_t kWelcomeGidTable = uint64_t{1} << 33;
struct ControlMessage {
  ControlType type = ControlType::kHello;
  int32_t status = 0;
  uint64_t value = 0;

  void Encode(uint8_t out[kControlSize]) const;
  static std::optional<ControlMessage> Decode(std::span<const uint8_t> in);
};

// Sends `m` as one packet on the SOCK_SEQPACKET socket `fd`, with `passed_fds` attached (SCM_RIGHTS, at most
// kMaxPassedFds). `flags` as send(2)'s (MSG_NOSIGNAL is always added). 0 or -errno.
inline constexpr size_t kMaxPassedFds = 4;
int SendControl(int fd, const ControlMessage& m, std::span<const int> passed_fds, int flags = 0);
// ... with one descriptor attached unless `passed_fd` is -1.
int SendControl(int fd, const ControlMessage& m, int passed_fd = -1, int flags = 0);
// Takes one control message queued on `fd` without waiting, and the descriptors that came with it (close-on-exec,
// the caller's to close, in the order sent). 0; -EAGAIN when none is queued; -ENOTCONN when the other end closed;
// -EPROTO for bytes that are not a control message or were cut short (descriptors that came along are closed);
// another -errno of recvmsg(2).
int TakeControl(int fd, ControlMessage* out, std::vector<int>* fds);
// Closes, when it goes, each descriptor of `fds` still there: those that came with a control message and were not
// taken (a taker sets its entry to -1).
class UntakenDescriptors {
 public:
  explicit UntakenDescriptors(std::vector<int>& fds) : fds_(fds) {}
  ~UntakenDescriptors();
  UntakenDescriptors(const UntakenDescriptors&) = delete;
  UntakenDescriptors& operator=(const UntakenDescriptors&) = delete;

 private:
  std::vector<int>& fds_;
};

// Waits up to `timeout_ms` for one control message on `fd` and decodes it. The descriptors that came along go to
// *fds (close-on-exec, the caller's to close), or are closed when `fds` is null. 0; -EAGAIN when the other end
// closed; -ETIMEDOUT; -EPROTO for bytes that are not a control message.
int ReceiveControl(int fd, int timeout_ms, ControlMessage* out, std::vector<int>* fds = nullptr);

// The abstract UNIX socket name (unix(7), without the leading NUL) of the device service for `address`: abstract
// names are per network namespace, as the device is.
std::string DeviceServiceName(const IpAddress& address);
// The abstract SOCK_SEQPACKET name on which process `owner` of that device takes packets from the host's other
// processes directly (wire/host_device_transport.h).
std::string HostDevicePeerName(const IpAddress& address, uint8_t owner);

}  // namespace uroce::wire
