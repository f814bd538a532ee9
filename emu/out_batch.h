// Packets built while a QP's lock is held, sent after it is released (Transport::Send may block on a full
// socket; the progress thread must not hold a QP while it does).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <utility>
#include <vector>

#include "emu/host_memory.h"
#include "wire/address.h"
#include "wire/icrc.h"
#include "wire/packet.h"
#include "wire/transport.h"

namespace uroce::emu {

// An allocator whose resize leaves new bytes uninitialised: EncodePacket writes every byte of a packet, and
// zero-filling 4 KiB first was one more pass over memory per packet.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <class U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// When the RC responder sends the ACK a request asked for (AckReq).
enum class AckTiming {
  kNow,  // before Device::OnDatagram returns
  // Held until the QP's requester sends (the ACK follows its packets), another ACK, NAK or response of the QP
  // covers or precedes it, Device::SendHeldAcks, or its time is up (RcResponder::kAckHoldNs, kAckCoalesceNs). For a
  // thread whose application may answer at once: a ping-pong's reply then leaves before the ACK of the request it
  // answers, so the peer, polling for that ACK, finds the reply already placed (ib_write_lat, ib_send_lat), and one
  // syscall carries both. ACKs a QP owes meanwhile leave as one (coalesced, IBTA 9.7.5.1.2).
  kHeld,
};

struct OutBatch {
  using Bytes = std::vector<uint8_t, UninitializedAllocator<uint8_t>>;
  struct Packet {
    wire::IpAddress src;  // the local address it leaves from (its GID)
    wire::UdpEndpoint dst;
    uint16_t src_port;
    Bytes bytes;

    // What the transport sends (valid while the packet lives).
    wire::OutDatagram Datagram() const {
      wire::OutDatagram d{dst, src_port, bytes};
      d.src_addr = src;
      return d;
    }
  };
  std::vector<Packet> packets;
  // When the RC responders of the datagram being processed send their ACKs (Device::OnDatagram says).
  AckTiming ack_timing = AckTiming::kNow;

  // The list of packets too is this thread's spare one when it has it (two allocations per message otherwise: the
  // post's batch and the receive's).
  OutBatch() {
    if (std::vector<Packet>* spare = SparePackets()) packets.swap(*spare);
  }
  OutBatch(const OutBatch&) = delete;
  OutBatch& operator=(const OutBatch&) = delete;
  // The packets' buffers go back to this thread's spares, and the emptied list too.
  ~OutBatch() {
    std::vector<Bytes>* spare = Spare();
    if (spare == nullptr) return;
    for (Packet& p : packets) {
      if (spare->size() >= kSpareBuffers) break;
      spare->push_back(std::move(p.bytes));
    }
    packets.clear();
    std::vector<Packet>* list = SparePackets();
    if (list != nullptr && list->capacity() < packets.capacity()) list->swap(packets);
  }

  // Encodes, seals the ICRC for the flow the transport will really use (from local address `src`, the GID of the
  // packet's QP: DeviceCore::SourceOf), and queues. False, and nothing queued, when the payload could not be read:
  // registered memory the program has unmapped since (emu/host_memory.h).
  bool Add(wire::Transport& t, const wire::PacketSpec& spec, std::span<const uint8_t> payload,
           const wire::IpAddress& src, const wire::UdpEndpoint& dst, uint16_t src_port) {
    return AddGathered(t, spec, std::span<const std::span<const uint8_t>>(&payload, 1), src, dst, src_port);
  }
  // The same with the payload gathered from `pieces` (straight from registered memory).
  bool AddGathered(wire::Transport& t, const wire::PacketSpec& spec,
                   std::span<const std::span<const uint8_t>> pieces, const wire::IpAddress& src,
                   const wire::UdpEndpoint& dst, uint16_t src_port) {
    size_t payload_len = 0;
    for (const auto& piece : pieces) payload_len += piece.size();
    // Room for a few packets at once: a ping-pong's request and the held ACK it takes along went through two
    // allocations (and a move) here.
    if (packets.capacity() == 0) packets.reserve(4);
    Packet p{src, dst, src_port, TakeBuffer()};
    p.bytes.resize(wire::EncodedLength(spec, payload_len));
    // A spec the engine builds is always complete: the only failure is a fault reading the payload.
    auto n = wire::EncodePacketGathered(spec, pieces, p.bytes, CopyGuarded);
    if (!n) return false;
    if (t.IcrcIsRead(dst, spec.bth.dest_qp)) {
      wire::SealIcrc(wire::OutgoingFlowFrom(t, src, dst, src_port), p.bytes);
    } else {
      std::memset(p.bytes.data() + p.bytes.size() - 4, 0, 4);  // unread (another process of the host), but defined
    }
    packets.push_back(std::move(p));
    return true;
  }

 private:
  // Packet buffers of this thread's earlier batches, kept for its next ones. Allocated per packet and freed after
  // each send, a burst of 64 4 KiB packets made glibc give its heap's top back to the system and fault it in again:
  // the sending thread spent a fifth of its time in page faults and TLB shootdowns (ib_write_bw 64 KiB, AckReq every
  // 64 packets). At most kSpareBuffers (a window's worth) per thread.
  static constexpr size_t kSpareBuffers = 512;
  // nullptr once the thread's thread_local objects are destroyed: an exit handler may still send (held ACKs).
  static std::vector<Bytes>* Spare() {
    static thread_local bool gone = false;  // trivially destructible: still readable then
    struct Spares {
      std::vector<Bytes> buffers;
      ~Spares() { gone = true; }
    };
    static thread_local Spares spares;
    return gone ? nullptr : &spares.buffers;
  }
  // This thread's spare list of packets (nullptr once its thread_local objects are destroyed, as Spare).
  static std::vector<Packet>* SparePackets() {
    static thread_local bool gone = false;
    struct List {
      std::vector<Packet> packets;
      ~List() { gone = true; }
    };
    static thread_local List list;
    return gone ? nullptr : &list.packets;
  }
  static Bytes TakeBuffer() {
    std::vector<Bytes>* spare = Spare();
    if (spare == nullptr || spare->empty()) return {};
    Bytes b = std::move(spare->back());
    spare->pop_back();
    return b;
  }
};

}  // namespace uroce::emu
