// Packets built while the device lock is held, sent after it is released (Transport::Send may block on a full
// socket; the progress thread must not hold the device while it does).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "wire/address.h"
#include "wire/icrc.h"
#include "wire/packet.h"
#include "wire/transport.h"

namespace uroce::emu {

struct OutBatch {
  struct Packet {
    wire::UdpEndpoint dst;
    uint16_t src_port;
    std::vector<uint8_t> bytes;
  };
  std::vector<Packet> packets;

  // Encodes, seals the ICRC for the flow the transport will really use, and queues.
  void Add(wire::Transport& t, const wire::PacketSpec& spec, std::span<const uint8_t> payload,
           const wire::UdpEndpoint& dst, uint16_t src_port) {
    Packet p{dst, src_port, std::vector<uint8_t>(wire::EncodedLength(spec, payload.size()))};
    auto n = wire::EncodePacket(spec, payload, p.bytes);
    if (!n) return;  // a spec the engine builds is always complete; nothing to send otherwise
    wire::SealIcrc(t.OutgoingFlow(dst, src_port), p.bytes);
    packets.push_back(std::move(p));
  }
};

}  // namespace uroce::emu
