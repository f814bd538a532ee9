// The Transport interface: how the HCA's packets reach a network. Everything above it (emu, verbs_api) sees only
// this, so a test replaces the io_uring UDP socket with the in-memory SimNetwork, and decorators add fault injection
// or pcap capture around any transport (the pattern Envoy uses to hide io_uring behind a replaceable interface).
//
// A datagram here is a UDP payload: the RoCEv2 packet from the BTH through the ICRC. The IP and UDP headers are the
// transport's business, but the ICRC covers some of their fields (IBTA Annex A17.3.3), so a sender asks the
// transport which 5-tuple a packet will really leave with (`OutgoingFlow`) and seals the ICRC for that.
//
// Error contract (as liburing's): functions that can fail return a non-negative count on success or -errno.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "wire/address.h"

namespace uroce::wire {

// One datagram to send. `payload` is BTH..ICRC with the ICRC already sealed for OutgoingFlow(dst, src_port).
struct OutDatagram {
  UdpEndpoint dst;
  uint16_t src_port = 0;  // Wanted UDP source port (RoCEv2 flow entropy); see Transport::OutgoingFlow.
  std::span<const uint8_t> payload;
  // The last 4 bytes are an ICRC sealed for OutgoingFlow. A transport that sends a run of datagrams in one UDP_SEGMENT
  // send, whose segments Linux numbers with IPv4 Identifications 0, 1, 2, ..., re-seals each for the ID it will
  // carry (wire::IcrcIpIdChange). false: opaque bytes, sent exactly as given (tests, non-RoCE traffic).
  bool has_icrc = true;
  // A fault injector flipped a bit of it after the ICRC was sealed (FaultInjectingTransport): the ICRC no longer
  // matches, and no transport may tell the receiver that it does (InDatagram::icrc_vouched).
  bool altered = false;
  // The local address it leaves from: the GID its QP's address vector names (ibv_modify_qp(3), ah_attr.grh.sgid_index).
  // Unspecified: the transport's own address (local()). A UDP socket is told another than its bound one per datagram
  // (IP_PKTINFO, ip(7): the kernel takes it over the socket's own); a sender names only addresses its device has.
  IpAddress src_addr;
};

// What a datagram from another process of the host holds besides packets (wire/direct_access.h).
enum class RingRecord : uint8_t {
  kPacket = 0,
  // A direct SEND (wire::DirectSend, then the message's bytes), which the sender checked against the receive window
  // this device published.
  kDirectSend = 1,
  // A piece of an XRC message for one of our XRC SRQs that another process's target QP received (wire::XrcDelivery,
  // then the packet's payload).
  kXrcDelivery = 2,
  // An asynchronous event of another process's XRC target QP that we hold a handle on (wire::XrcTargetEvent).
  kXrcTargetEvent = 3,
  // A request to modify one of our XRC target QPs from a process holding a handle on it, or our answer to it
  // (wire::XrcTargetModify; a request's attributes follow).
  kXrcTargetModify = 4,
  // Another process offers us the second half of its RDMA WRITE into our memory to copy ourselves (wire::CopyOffer;
  // the offer waits in our direct table): the transport takes it, never the device.
  kCopyOffer = 5,
};
// The last kind: a header naming a later one is not ours (wire::ForwardHeader::Decode).
inline constexpr RingRecord kLastRingRecord = RingRecord::kCopyOffer;

// One received datagram, valid only during the handler call.
struct InDatagram {
  UdpEndpoint src;
  UdpEndpoint dst;
  std::span<const uint8_t> payload;
  // IPv4 Identification when the transport saw the IP header (simulated network, pcap); nullopt for a UDP socket,
  // which does not expose it. The ICRC covers it, so a receiver that lacks it must say so when verifying.
  std::optional<uint16_t> ip_id;
  uint64_t timestamp_ns = 0;  // Arrival time on the transport's clock.
  // The receiver's queue was more than half full when this datagram was taken from it: what a switch marks Congestion
  // Experienced (ECN CE) when its queue passes a threshold, and what a RoCEv2 receiver answers with a CNP (Annex
  // A17.9). A UDP socket's receive buffer is the queue of the path into this process.
  bool congestion_experienced = false;
  // A process of this host sealed the ICRC and nothing altered the packet on its way (it crossed no network, and no
  // fault injector touched it): the receiver need not check it again, as Linux does not check the checksums of what
  // it loops back (CHECKSUM_UNNECESSARY). A receive-side injector that alters the packet clears it.
  bool icrc_vouched = false;
  // What the datagram holds: a packet, or a record another process of this host wrote into our ring
  // (wire/direct_access.h).
  RingRecord record = RingRecord::kPacket;
};

// The header fields of a datagram as it will appear on the wire: what the ICRC is computed over.
struct Flow {
  UdpEndpoint src;
  UdpEndpoint dst;
  uint16_t ip_id = 0;  // IPv4 only. DF datagrams from an unconnected socket with IP_PMTUDISC_DO leave with ID 0.
};

using DatagramHandler = std::function<void(const InDatagram&)>;

class Transport {
 public:
  virtual ~Transport() = default;

  // The bound address and port datagrams arrive on.
  virtual UdpEndpoint local() const = 0;

  // The flow a datagram to `dst` wanting source port `src_port` will leave with from the transport's own address (for
  // another local address: OutgoingFlowFrom). A UDP socket always sends from its bound port; the simulated network
  // honours src_port. Thread-safe.
  virtual Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t src_port) const = 0;

  // Sends a batch. Returns how many datagrams were handed to the network (possibly fewer than batch.size() when the
  // transport is out of room; the caller retries the rest), or -errno. A datagram lost afterwards is not reported:
  // this is a datagram network. Thread-safe; payload memory may be reused as soon as Send returns.
  virtual int Send(std::span<const OutDatagram> batch) = 0;

  // Delivers received datagrams to `handler` on the calling thread. Waits up to timeout_ns for the first one
  // (0: do not wait; negative: wait until one arrives or Wake()). Returns how many were delivered (0 on timeout or
  // wake-up), or -errno. One thread polls at a time. A Wake() while no Poll waits makes the next Poll that would
  // wait return at once (a Poll that may not wait leaves it pending).
  virtual int Poll(const DatagramHandler& handler, int64_t timeout_ns) = 0;

  // Makes a Poll blocked in another thread return promptly. Thread-safe, async-signal-unsafe.
  virtual void Wake() = 0;

  // Whether receives stay armed in the kernel between Polls (the default). An armed receive (io_uring) takes a
  // datagram the moment it arrives and wakes the thread that armed it, even when another thread is about to look;
  // with `armed` false a datagram waits in the socket, waking no one, until a Poll from whichever thread (one at a
  // time, as always) takes it. The engine disarms while application threads drive progress themselves
  // (docs/ARCHITECTURE.md, "Progress"). Called between Polls; transports that arm nothing ignore it.
  virtual void SetReceiveArmed(bool armed) { (void)armed; }

  // Whether anyone will read the ICRC of a datagram to `dst` for QP `dest_qpn`. false when it goes through a
  // shared-memory ring to another process of the host, which takes it on this process's word
  // (InDatagram::icrc_vouched), and nothing captures or alters it: the sender may leave it unsealed, as Linux leaves
  // the checksums of what it loops back uncomputed. Thread-safe.
  virtual bool IcrcIsRead(const UdpEndpoint& dst, uint32_t dest_qpn) const {
    (void)dst;
    (void)dest_qpn;
    return true;
  }
};

// The flow a datagram to `dst` from local address `src_addr` (OutDatagram::src_addr) leaves with.
inline Flow OutgoingFlowFrom(const Transport& t, const IpAddress& src_addr, const UdpEndpoint& dst, uint16_t src_port) {
  Flow f = t.OutgoingFlow(dst, src_port);
  if (!src_addr.is_unspecified()) f.src.addr = src_addr;
  return f;
}

}  // namespace uroce::wire
