// HostDeviceTransport: the Transport of one process's share of the host device (docs/ARCHITECTURE.md, "The host
// device"). The host's device service holds UDP 4791 of the device's address and forwards each packet arriving there
// to the process that owns its destination (wire/service_protocol.h: a ForwardHeader, then the RoCEv2 packet): into
// a PacketRing the process offers it at start (OfferServiceRing), or else on a datagram socket the process handed it
// when it joined. Sending needs no one: a RoCEv2 receiver looks only at the destination port,
// so the process sends from a UDP socket of its own on the same address and an ephemeral source port (the flow
// entropy a RoCE source port carries anyway).
//
// Packets between two processes of the host device never pass the service (SameHostPath). Each process listens on
// an abstract SOCK_SEQPACKET name of its own (HostDevicePeerName: address and owner number), and a sender whose
// packet is for its own address and names an owner (a data packet's DestQP; CM MADs still go by UDP, the service
// routes them) connects to the owner's name once. The receiver answers the connection with a kRingOffer: a
// PacketRing (wire/packet_ring.h) in a memfd and its doorbell eventfd; from then on the sender writes each packet,
// with the same ForwardHeader, into that ring: no system call per packet, and none at all while the receiver polls
// (the engine's progress thread spins after traffic, an application that polls its CQs receives itself). Until the
// offer arrives the packets go on the connection itself; the receiver takes those first, so that the switch does
// not reorder a QP's packets. A full ring or connection drops the packet (counted), as a full UDP receive buffer
// would: blocking could deadlock two processes sending to each other, and RC retransmits. Both ends of a peer
// connection must run as our user or root (SO_PEERCRED), as the service admits only those: another user's process
// holding a name gets nothing.
//
//  - Send / OutgoingFlow: the `sender` transport's (a SocketTransport bound to address:0), or the peer's ring, or
//    the peer connection.
//  - Poll: first the rings (the service's and those of the processes that send to us: no system call), then (at most
//    every 20 us while rings exist and the caller may not wait) epoll over the service's forward socket, the peer
//    listener and the accepted peer connections, a wake-up eventfd (also every ring's doorbell) and the control
//    socket to the service, whose hang-up (the service died) is reported once through `on_service_lost`, from the
//    polling thread.
//  - Direct access (wire/direct_access.h, EnableDirectAccess): RDMA WRITE and READ towards another process of the
//    host without a packet. Our DirectTable goes to each process that connects to us, with the ring offer; theirs
//    comes to us with theirs. A peer that exits (its pidfd) or hangs up takes its table out of use at once, before
//    its pid could name another process.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "wire/address.h"
#include "wire/direct_access.h"
#include "wire/headers.h"
#include "wire/packet_ring.h"
#include "wire/service_protocol.h"
#include "wire/transport.h"
#include "wire/udp_socket.h"

namespace uroce::wire {

// How packets between two processes of one host travel (UROCE_SAME_HOST).
enum class SameHostPath {
  kSharedMemory,  // PacketRings, offered by each receiver (the default)
  kUnixSocket,    // the peer connection itself: one sendmmsg per run, one wake-up per receive
  kUdp,           // the network's way: every packet on real UDP to the device's UDP 4791, for tcpdump
};

class HostDeviceTransport final : public Transport, public DirectAccess, public SharedXrc, public ExportedObjects {
 public:
  // `forward_fd`: our end of the datagram socket the service forwards on (taken over: closed by the destructor).
  // `control_fd`: the connection to the service, only watched (not closed). `local`: address:4791 of the device.
  // `owner`: our owner number (the name we listen on for the host's other processes).
  HostDeviceTransport(std::unique_ptr<Transport> sender, const UdpEndpoint& local, uint8_t owner, int forward_fd,
                      int control_fd, std::function<void()> on_service_lost,
                      SameHostPath same_host = SameHostPath::kSharedMemory);
  ~HostDeviceTransport() override;
  HostDeviceTransport(const HostDeviceTransport&) = delete;
  HostDeviceTransport& operator=(const HostDeviceTransport&) = delete;

  // The UDP socket the service handed us (HostDeviceMembership::TakeSteeredFd), to which the kernel steers our
  // packets from other hosts (wire::AttachOwnerSteering): taken over. Call before Init; without one, the service
  // forwards them.
  void AdoptSteeredSocket(int fd) { steered_fd_ = fd; }
  // Called (from the polling thread, at its next Poll) with the owner number of a process of the host that is gone:
  // our connection to it hung up or its process exited, or a packet for it found nobody listening under its name.
  // Its rdma_cm connections then end as its kernel would have ended them (emu::ConnectionManager::
  // OnPeerProcessGone). Once per owner until a connection to that number succeeds again. Set before Init.
  void SetPeerGoneHandler(std::function<void(uint8_t owner)> on_peer_gone) {
    on_peer_gone_ = std::move(on_peer_gone);
  }
  bool has_steered_socket() const { return steered_fd_ >= 0; }
  // How AdoptOwner asks the service for a gone process's owner number (HostDeviceMembership::AdoptOwner): 0 or an
  // errno (EALREADY: another process has it). Set before Init.
  void SetOwnerAdopter(std::function<int(uint8_t owner)> adopt) { adopt_owner_ = std::move(adopt); }

  // 0, or -errno: of eventfd(2), epoll_create1(2), or of binding our peer name (-EADDRINUSE: someone holds it).
  int Init();
  // Makes a ring for what the service forwards (packets from other hosts) and hands it, with our doorbell, to
  // `offer` (HostDeviceMembership::OfferRing: returns 0 or an errno). From then on those packets come through the
  // ring, after any still queued on the forward socket. 0, or -errno of PacketRing::Create or of `offer` (the
  // forward socket stays the way in).
  int OfferServiceRing(const std::function<int(int ring_fd, uint64_t ring_bytes, int doorbell)>& offer);

  // Makes our DirectTable, which every process that connects to us from now on receives with our ring offer, and
  // carries one-sided operations towards those that offer theirs without packets (the shared-memory path only). Call
  // after Init and before packets flow. 0, or -errno of DirectTable::Create; -ENOTSUP on another same-host path.
  int EnableDirectAccess();
  // Makes the same table for our XRC SRQs alone (EnableDirectAccess makes it too): other processes' target QPs of
  // a domain we share then deliver into them (SharedXrc). 0, or -errno as EnableDirectAccess.
  int ShareXrcSrqs();

  // DirectAccess (wire/direct_access.h).
  bool Write(const UdpEndpoint& peer, uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey, uint64_t va,
             std::span<const std::span<const uint8_t>> pieces, uint64_t length) override;
  bool Read(const UdpEndpoint& peer, uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey, uint64_t va,
            std::span<const std::span<uint8_t>> pieces, uint64_t length) override;
  bool SendMessage(const UdpEndpoint& peer, DirectSend& send, std::span<const std::span<const uint8_t>> pieces,
                   uint64_t length) override;
  void PublishQp(const QpEntry& qp) override;
  void WithdrawQp(uint32_t qpn) override;
  void PublishRegion(const Region& region) override;
  void WithdrawRegion(uint32_t rkey) override;
  void OpenReceives(uint32_t qpn, uint32_t epoch) override;
  void PublishReceives(uint32_t qpn, uint64_t packets_taken, uint64_t first,
                       std::span<const uint32_t> lengths) override;
  uint64_t DirectSends(uint32_t qpn) override;
  void CloseReceives(uint32_t qpn) override;
  // SharedXrc (wire/direct_access.h).
  bool PublishXrcSrq(uint32_t srqn, uint64_t domain) override;
  uint64_t XrcWqesClaimed(uint32_t srqn) override;
  void ShowXrcWqes(uint32_t srqn, uint64_t first, std::span<const uint32_t> lengths) override;
  void WithdrawXrcSrq(uint32_t srqn) override;
  int XrcSrqInDomain(uint32_t srqn, uint64_t domain) override;
  bool ClaimXrcWqe(uint32_t srqn, uint64_t* index, uint32_t* length) override;
  bool DeliverXrc(const XrcDelivery& delivery, std::span<const uint8_t> bytes) override;
  bool PublishXrcTarget(uint32_t qpn, uint64_t domain, std::span<const uint8_t> attributes,
                        const uint64_t* holders) override;
  bool ReleaseXrcTarget(uint32_t qpn) override;
  void WithdrawXrcTarget(uint32_t qpn) override;
  // Also notes the holders' pids in our table, for when we publish the QP as ours.
  bool ReadGoneXrcTarget(uint32_t qpn, std::span<uint8_t> attributes, uint64_t holders[4]) override;
  // Asks the service through the adopter SetOwnerAdopter gave, then listens under the owner's peer name too: the
  // host's other processes reach its QPNs here from now on.
  int AdoptOwner(uint8_t owner) override;
  // These three wait up to kOpenWaitMs for the owner's table when we connect to its process just now (TableOf).
  int OpenXrcTarget(uint32_t qpn, uint64_t domain) override;
  bool ReadXrcTarget(uint32_t qpn, std::span<uint8_t> attributes) override;
  void CloseXrcTarget(uint32_t qpn) override;
  void TellXrcTargetHolders(uint32_t qpn, uint8_t event) override;
  // Waits up to kOpenWaitMs (the answer comes through our ring, which our polling thread reads).
  int ModifyXrcTarget(uint32_t qpn, std::span<const uint8_t> attributes, uint32_t mask) override;
  void AnswerXrcTargetModify(uint8_t owner, uint32_t request, int result) override;
  bool HoldsXrcTarget(uint32_t qpn, uint8_t owner) override;

  // ExportedObjects (wire/direct_access.h): into our table, when there is one (EnableDirectAccess, ShareXrcSrqs).
  void ExportPd(uint32_t handle) override;
  void WithdrawPd(uint32_t handle) override;
  void ExportRegion(const ExportedRegion& region) override;
  void WithdrawExportedRegion(uint32_t lkey) override;
  // Importing from the process of owner number `owner` (each waits up to kOpenWaitMs for its table, as
  // OpenXrcTarget): its PD `handle` (0; -EINVAL: none such, or no table of it to use; -EAGAIN: its process cannot be
  // asked); its region of handle `handle`, into *out (the same); copies from [there, there + n) of its region `lkey`
  // (its addresses) into `into`, or from `from` into it: whether all of it was copied (false once the region is
  // withdrawn or its process is gone, or when cross-memory attach is refused).
  int ImportablePd(uint8_t owner, uint32_t handle);
  int ImportableRegion(uint8_t owner, uint32_t handle, ExportedRegion* out);
  bool ReadExported(uint8_t owner, uint32_t lkey, uint64_t there, void* into, size_t n);
  bool WriteExported(uint8_t owner, uint32_t lkey, uint64_t there, const void* from, size_t n);
  uint8_t owner() const { return owner_; }

  UdpEndpoint local() const override { return local_; }
  // The host's addresses besides local()'s, where the service receives too (it listens on every address): a packet to
  // one of them whose destination QP names a process of the host goes to that process as one to local() does.
  void SetOtherHostAddresses(std::vector<IpAddress> others);
  // A second sending transport, of the other IP family than local()'s, for datagrams whose destination is of that
  // family (the host's GIDs of that family are their sources, named by IPV6_PKTINFO / IP_PKTINFO). Set before packets
  // flow. Without it such datagrams fail as the one socket's family does (-EAFNOSUPPORT).
  void SetOtherFamilySender(std::unique_ptr<Transport> sender) { other_family_sender_ = std::move(sender); }
  Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t src_port) const override {
    return SenderFor(dst).OutgoingFlow(dst, src_port);
  }
  int Send(std::span<const OutDatagram> batch) override;
  // Unread (false) towards another process of the host once LeaveUnreadIcrcsUnsealed was called: what a data
  // packet's DestQP routes to a process goes process to process and is vouched for; CM MADs and multicast leave by UDP.
  bool IcrcIsRead(const UdpEndpoint& dst, uint32_t dest_qpn) const override {
    if (!icrc_unread_to_peers_ || !IsHostEndpoint(dst)) return true;
    return OwnerOf24(dest_qpn) == 0 || dest_qpn == kMulticastQpn;
  }
  // Packets for another process of the host go without an ICRC (IcrcIsRead): for when nothing captures or alters
  // them (the engine asks it with direct access). The shared-memory path only.
  void LeaveUnreadIcrcsUnsealed() { icrc_unread_to_peers_ = same_host_ == SameHostPath::kSharedMemory; }
  int Poll(const DatagramHandler& handler, int64_t timeout_ns) override;
  void Wake() override;

  // A polling thread that may not wait looks at its sockets at most every kSocketLookEveryNs times `scale` (a
  // machine that runs `scale` times slower than an ordinary one; 1 or more). Call before the first Poll.
  void StretchSocketLooks(double scale) {
    socket_look_every_ns_ = uint64_t(double(kSocketLookEveryNs) * (scale > 1 ? scale : 1));
  }

  // Packets will go to QP `qpn` at `dst` (a QP entering RTR): if that is another process of this host, connect to it
  // now, so that its ring is offered before the first packet instead of after it (the first packets of a pair went
  // through the connection while the receiver accepted it and offered its ring: ~0.3-2 ms of a ping-pong's first
  // round trip here, 10-15 ms in a TCG guest). Nothing if it is not, or not there (the first packet tries again).
  // With direct access on, waits up to kOfferWaitMs for the offer.
  void ConnectAhead(const UdpEndpoint& dst, uint32_t qpn);

  uint64_t malformed() const { return malformed_.load(std::memory_order_relaxed); }
  // Packets for a process of this host that could not be handed over (no such process, its connection full).
  uint64_t peer_drops() const { return peer_drops_.load(std::memory_order_relaxed); }
  uint64_t peer_sent() const { return peer_sent_.load(std::memory_order_relaxed); }
  // Of peer_sent, those written into a receiver's shared-memory ring.
  uint64_t ring_sent() const { return ring_sent_.load(std::memory_order_relaxed); }
  // Datagrams from other hosts the kernel steered to our own socket (not through the service).
  uint64_t steered_received() const { return steered_received_.load(std::memory_order_relaxed); }
  // The processes of the host whose DirectTable we use now.
  size_t direct_peers();
  // The bytes of one-sided operations carried out directly in another process's memory (emu counts the operations).
  uint64_t direct_bytes() const { return direct_bytes_.load(std::memory_order_relaxed); }
  // WRITEs whose second half the target's process copied itself (DirectTable::OfferCopy), as initiator; halves we
  // copied for other processes' WRITEs into our memory, as target.
  uint64_t shared_writes() const { return shared_writes_.load(std::memory_order_relaxed); }
  uint64_t halves_copied() const { return halves_copied_.load(std::memory_order_relaxed); }
  // When another process's offer last came (a CopyOffer notice, taken or not; SystemClock's time, 0: never).
  uint64_t last_offer_ns() const { return last_offer_ns_.load(std::memory_order_relaxed); }
  // How long a target may take to take its half (kOfferTakeNs): a knob for tests, set before WRITEs flow.
  void SetOfferTakeNs(uint64_t ns) { offer_take_ns_ = ns; }

  static constexpr unsigned kBatch = 64;
  static constexpr size_t kMaxDatagram = 9216;                 // a RoCEv2 packet of a 9000-byte MTU, with room
  static constexpr size_t kMaxForwarded = kMaxDatagram + 64;  // and a ForwardHeader in front
  // While rings exist, a polling thread that may not wait looks at its sockets at most this often: an epoll_wait
  // costs more than a ring's whole hand-off, and with the service forwarding into a ring too, the sockets carry only
  // new peer connections, hang-ups, wake-ups for a sleeper and the fallback paths.
  static constexpr uint64_t kSocketLookEveryNs = 20'000;
  // A direct WRITE of at least this many bytes is shared with the target's process when that process is awake to
  // take its half (DirectTable::OfferCopy): below it, a copy's hand-over costs more than half the copy saves.
  static constexpr uint64_t kShareWriteBytes = 32 << 10;
  // How long after our own half the target's process may take to take its half before we take it back: it looks at
  // its rings within a microsecond while it spins; one asleep takes tens to wake.
  static constexpr uint64_t kOfferTakeNs = 1'000;
  // A target asleep is woken for an offer only while WRITEs to it follow each other this closely (a stream, as
  // ib_write_bw's): waking it costs it a wake-up each time and us nothing but the record (we take the half back),
  // but it then spins, awake for the ones after. A ping-pong's WRITEs (ib_write_lat) are a round trip apart.
  static constexpr uint64_t kStreamGapNs = 1'000;
  // How long ConnectAhead waits for the ring offer (with its DirectTable) when direct access is on.
  static constexpr int kOfferWaitMs = 50;
  // How long OpenXrcTarget waits for a process it never talked to to offer its table (ibv_open_qp(3) is a verb that
  // answers at once; the other process's polling thread offers when it accepts us, unless it is starved).
  static constexpr int kOpenWaitMs = 1000;

 private:
  // Our connection to another process of the host (sending side).
  struct Peer {
    int fd = -1;
    std::mutex mu;  // one sender at a time writes its ring
    std::unique_ptr<PacketRing> ring;
    int doorbell = -1;
    bool offer_answered = false;  // its kRingOffer came (with a ring or without)
    std::atomic<bool> closed{false};  // it hung up: connect again (its number may belong to a newcomer by then)
    pid_t pid = 0;                    // of the process at the other end (SO_PEERCRED, in our pid namespace)
    std::atomic<uint64_t> last_write_ns{0};  // when our last direct WRITE to it ended (OfferWorthIt)
    uint8_t owner = 0;                // its owner number
    // Its DirectTable, once its ring offer brought one that names the same process; null again once it hangs up or
    // exits. Its exit is seen through a pidfd (pidfd_open(2)) in our epoll: the connection's hang-up alone comes late
    // when a child it forked holds its end, and a pid may be given to another process once its owner is gone.
    // Set by whichever thread takes its offer, read by the polling thread when it fires (after its epoll_ctl).
    std::atomic<int> pidfd{-1};
    std::unique_ptr<DirectTable> table_owned;
    std::atomic<DirectTable*> table{nullptr};
    ~Peer();
  };
  // A connection from another process of the host, or the service's forward socket (receiving side; polling thread
  // only).
  struct Inbound {
    int fd = -1;  // the connection (ours to close), or forward_fd_
    std::unique_ptr<PacketRing> ring;  // what it writes to us
    bool socket_drained = false;  // what it sent on the connection before the ring has been taken
  };

  // Makes a ring for a sender to write to us and hands it with our doorbell to `offer` (0 or an errno); *ring holds
  // it on success. 0, or -errno of PacketRing::Create or of `offer`.
  int OfferRing(const std::function<int(int ring_fd, uint64_t ring_bytes, int doorbell)>& offer,
                std::unique_ptr<PacketRing>* ring);
  int ReceiveQueued(int fd, const DatagramHandler& handler, bool* closed);
  // One ForwardHeader + packet, as the service, a peer connection or a ring hands it over: to `handler`, or counted
  // as malformed. `from_peer`: another process of this host sent it (not the service). Returns whether it was
  // delivered.
  bool Deliver(std::span<const uint8_t> bytes, uint64_t now, bool from_peer, const DatagramHandler& handler);
  int DrainRings(const DatagramHandler& handler);
  // Drains one inbound connection's ring, the connection's own packets first (Inbound::socket_drained).
  int DrainRing(Inbound& in, uint64_t now, const DatagramHandler& handler);
  int ReceiveReady(const DatagramHandler& handler, int timeout_ms);
  // What the kernel steered to our socket (one receive's worth: a recvmmsg of UDP_GRO runs). How many delivered.
  int ReceiveSteered(const DatagramHandler& handler);
  // Takes the connections waiting on `listener` (our name's, or an adopted owner's).
  void Accept(int listener);
  void CloseInbound(int fd, const DatagramHandler& handler);
  // Whether `owner` is ours: our own number or one we adopted (AdoptOwner).
  bool IsOurs(uint8_t owner) const {
    return owner == owner_ || (owner != 0 && adopted_[owner].load(std::memory_order_acquire));
  }
  // The table of the last process of number `owner` we talked to, even if it is gone (null: none).
  DirectTable* LastTableOf(uint8_t owner);
  // The table of the process of number `owner` now, waiting up to kOpenWaitMs for its offer when we connect to it just
  // now (null: no such process, none whose table we may use, or no offer yet: then *unanswered, if given); our
  // connection to it in *found, if given, when there is a table (its ring takes our records: WriteRecord).
  DirectTable* TableOf(uint8_t owner, bool* unanswered, Peer** found = nullptr);
  // Enter, the region's check (DirectTable::Exported), `copy(pid)` and Leave, for ReadExported / WriteExported.
  template <typename Copy>
  bool ExportedCopy(uint8_t owner, uint32_t lkey, uint64_t there, size_t n, const Copy& copy);
  // The owner a datagram goes to directly, or 0 (to the network, the service included).
  uint8_t PeerOwner(const OutDatagram& dg) const;
  // Hands the first datagrams of `run` (all for process `owner`; at most kBatch) to it: into its ring, or in one
  // sendmmsg on the connection, or drops them (counted: no such process, its ring or connection full). Returns how
  // many it took.
  size_t SendToPeer(uint8_t owner, std::span<const OutDatagram> run);
  // The ForwardHeader in front of `dg` when it goes to another process: the flow its ICRC was sealed for.
  void EncodeForwardHeader(const OutDatagram& dg, uint8_t out[ForwardHeader::kSize]) const;
  // Writes `run` into the peer's ring (its lock held). Returns how many fitted.
  size_t WriteToRing(Peer& peer, std::span<const OutDatagram> run);
  // Takes the peer's kRingOffer if it has come (its lock held).
  void TakeRingOffer(Peer& peer);
  Peer* PeerFor(uint8_t owner, bool reconnect);
  // The table of the process that owns `dest_qpn` at `peer`, when direct access may go there; *found our connection
  // to that process (its pid, its ring).
  DirectTable* DirectTableFor(const UdpEndpoint& peer, uint32_t dest_qpn, Peer** found);
  // The table of the process holding owner number `owner` (nullptr: ours, none, or not reachable), whatever direct
  // access may do; *found as DirectTableFor's.
  DirectTable* PeerTable(uint8_t owner, Peer** found);
  // Writes a record of `kind` into `p`'s ring (a ForwardHeader, `record`, then `pieces`), under `p.mu`, and rings its
  // doorbell; `written()` runs once it is in, before it is published. False when `p` has no ring, or no room.
  static constexpr size_t kMaxRecordBytes = 32;
  template <typename Written>
  bool WriteRecord(Peer& p, const UdpEndpoint& dst, RingRecord kind, std::span<const uint8_t> record,
                   std::span<const std::span<const uint8_t>> pieces, const Written& written);
  // The table that publishes XRC SRQ `srqn`: ours, or its owner's (nullptr when not reachable; *found as
  // PeerTable's).
  DirectTable* SrqTableFor(uint32_t srqn, Peer** found);
  // Write and Read: checks the access against the table of `dest_qpn`'s process and, if allowed, runs copy(our
  // connection to it, its table, address there) between Enter and Leave. Whether it was done.
  template <typename Copy>
  bool DirectCopy(const UdpEndpoint& peer, uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey, uint64_t va,
                  uint64_t length, uint32_t right, const Copy& copy);
  // What a copy's result (CopyToProcess, CopyFromProcess, or 0 when the table refused) means: whether it was done.
  // A refusal of cross-memory attach itself turns direct access off, said once on stderr.
  bool DirectDone(int rc, uint64_t length);
  // Copies a direct WRITE of `pieces` (`length` bytes) to `there` in `p`'s process, checked for R_Key `rkey` in
  // `table`: its second half by that process when it takes our offer in time (DirectTable::OfferCopy), the rest by
  // us. As CopyToProcess: 1 when all was copied, 0 when less, -errno.
  int CopyWrite(Peer& p, DirectTable& table, uint32_t rkey, uint64_t there,
                std::span<const std::span<const uint8_t>> pieces, uint64_t length);
  // Whether an offer to `p` is worth making now: its process is awake, or our WRITEs to it are a stream.
  bool OfferWorthIt(Peer& p, uint64_t now);
  // Another process's offer (a CopyOffer record from owner number `owner`): taken and copied if still there.
  void TakeCopyOffer(uint8_t owner);
  // Watches the peer's process for its exit (a pidfd in our epoll, tagged as its connection's hang-up is): whether
  // its table may be used (false: the process is gone already, or the watch could not be set).
  bool WatchExit(Peer& peer);
  // A peer connection hung up or its process exited (polling thread): its table is no longer used, and
  // on_peer_gone_ hears of it (NoteGoneLocked).
  void PeerGone(Peer* peer);
  // Owner `owner` is gone: queued for on_peer_gone_ unless already reported (any thread; peers_mu_ held), the
  // polling thread woken. The polling thread's part: hands the queued owners to on_peer_gone_.
  void NoteGoneLocked(uint8_t owner);
  void ReportGone();

  std::unique_ptr<Transport> sender_;
  std::unique_ptr<Transport> other_family_sender_;  // SetOtherFamilySender
  // The transport a datagram to `dst` leaves by: sender_, or other_family_sender_ for the other family.
  Transport& SenderFor(const UdpEndpoint& dst) const {
    return other_family_sender_ && dst.addr.is_v4() != local_.addr.is_v4() ? *other_family_sender_ : *sender_;
  }
  UdpEndpoint local_;
  // SetOtherHostAddresses's list, read without a lock for every packet to another host (PeerOwner, IcrcIsRead): a new
  // list takes the pointer's place and the lists it replaced stay in others_kept_ until the transport goes, so a
  // reader never holds a freed one (the host's addresses change seldom; a list is at most a GID table's worth).
  std::mutex others_mu_;  // SetOtherHostAddresses against itself
  std::vector<std::unique_ptr<const std::vector<IpAddress>>> others_kept_;
  std::atomic<const std::vector<IpAddress>*> others_{nullptr};
  // `ep` is UDP 4791 of one of the host's addresses (local() or another).
  bool IsHostEndpoint(const UdpEndpoint& ep) const;
  uint8_t owner_;
  int forward_fd_;
  int control_fd_;
  SameHostPath same_host_;
  int wake_fd_ = -1;  // Wake() and our rings' doorbell
  // ModifyXrcTarget's requests waiting for their answers (Deliver takes the answers out of the ring).
  std::mutex modify_mu_;
  std::condition_variable modify_answered_;
  uint32_t next_modify_ = 1;
  std::unordered_map<uint32_t, int> modify_answers_;  // request -> result
  std::atomic<bool> woken_{false};  // ReceiveReady consumed wake_fd_ and no call that could wait has returned since
  int epoll_fd_ = -1;
  int listen_fd_ = -1;
  std::function<void()> on_service_lost_;
  bool service_lost_ = false;
  std::function<void(uint8_t)> on_peer_gone_;
  std::vector<uint8_t> buffers_;
  std::vector<Inbound> inbound_;  // connections to us (polling thread only)
  bool rings_ = false;            // some inbound connection has a ring
  unsigned ring_polls_ = 0;       // zero-timeout polls since the sockets were last looked at
  uint64_t sockets_seen_ns_ = 0;
  uint64_t socket_look_every_ns_ = kSocketLookEveryNs;
  std::mutex peers_mu_;           // our connections to the other processes
  std::map<uint8_t, std::unique_ptr<Peer>> peers_;
  std::vector<std::unique_ptr<Peer>> retired_;  // replaced, kept to the end (another thread may still send on them)
  std::array<bool, 256> gone_reported_{};        // by owner: NoteGoneLocked queued it (peers_mu_)
  std::vector<uint8_t> gone_queue_;              // for ReportGone (peers_mu_)
  std::atomic<bool> gone_pending_{false};        // gone_queue_ is not empty: Poll's one look
  std::atomic<uint64_t> malformed_{0}, peer_drops_{0}, peer_sent_{0}, ring_sent_{0};
  int steered_fd_ = -1;  // AdoptSteeredSocket
  DatagramReceiver steered_receiver_;
  UdpCounterSet steered_counters_;
  // While packets come steered, a polling thread that may not wait receives from the socket at every look (as the
  // per-process device does), not only when it looks at its sockets (kSocketLookEveryNs).
  uint64_t steered_until_ns_ = 0;
  static constexpr uint64_t kSteeredActiveNs = 1'000'000;
  std::atomic<uint64_t> steered_received_{0};
  bool icrc_unread_to_peers_ = false;  // LeaveUnreadIcrcsUnsealed (set before packets flow)
  std::unique_ptr<DirectTable> direct_table_;  // ours (EnableDirectAccess)
  int direct_table_fd_ = -1;
  pid_t self_pid_ = 0;
  // Owner numbers of gone processes we took over (AdoptOwner), and the listeners under their names.
  std::function<int(uint8_t)> adopt_owner_;
  std::array<std::atomic<bool>, 256> adopted_{};
  std::vector<int> adopted_listen_fds_;
  std::atomic<bool> direct_refused_{false};
  std::atomic<uint64_t> direct_bytes_{0};
  uint64_t offer_take_ns_ = kOfferTakeNs;
  std::atomic<uint64_t> shared_writes_{0};
  std::atomic<uint64_t> halves_copied_{0};
  std::atomic<uint64_t> last_offer_ns_{0};
};

}  // namespace uroce::wire
