// Packets built while a QP's lock is held, sent after it is released (Transport::Send may block on a full
// socket; the progress thread must not hold a QP while it does).
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <utility>
#include <vector>

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

struct OutBatch {
  struct Packet {
    wire::UdpEndpoint dst;
    uint16_t src_port;
    std::vector<uint8_t, UninitializedAllocator<uint8_t>> bytes;
  };
  std::vector<Packet> packets;

  // Encodes, seals the ICRC for the flow the transport will really use, and queues.
  void Add(wire::Transport& t, const wire::PacketSpec& spec, std::span<const uint8_t> payload,
           const wire::UdpEndpoint& dst, uint16_t src_port) {
    AddGathered(t, spec, std::span<const std::span<const uint8_t>>(&payload, 1), dst, src_port);
  }
  // The same with the payload gathered from `pieces` (straight from registered memory).
  void AddGathered(wire::Transport& t, const wire::PacketSpec& spec,
                   std::span<const std::span<const uint8_t>> pieces, const wire::UdpEndpoint& dst,
                   uint16_t src_port) {
    size_t payload_len = 0;
    for (const auto& piece : pieces) payload_len += piece.size();
    Packet p{dst, src_port, {}};
    p.bytes.resize(wire::EncodedLength(spec, payload_len));
    auto n = wire::EncodePacketGathered(spec, pieces, p.bytes);
    if (!n) return;  // a spec the engine builds is always complete; nothing to send otherwise
    wire::SealIcrc(t.OutgoingFlow(dst, src_port), p.bytes);
    packets.push_back(std::move(p));
  }
};

}  // namespace uroce::emu
