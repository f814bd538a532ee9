// A whole RoCEv2 packet as carried in a UDP datagram: BTH, the extension headers its opcode requires (opcode.h),
// payload, 0-3 pad bytes and the 4-byte ICRC (IBTA Vol 1 9.2-9.3, Annex A17.3).
//
// ParsePacket splits a datagram into a PacketView without copying the payload; it checks structure only -- that the
// opcode is known, the transport version is 0, the lengths add up -- and never the ICRC (icrc.h), which needs the
// IP/UDP flow. EncodePacket is its inverse for a sender: it writes headers, payload and pad, and leaves a zero ICRC
// for SealIcrc to fill in once the flow is known.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "wire/expected.h"
#include "wire/headers.h"
#include "wire/opcode.h"

namespace uroce::wire {

inline constexpr size_t kIcrcSize = 4;
// Smallest datagram that can be a RoCEv2 packet: BTH + ICRC.
inline constexpr size_t kMinPacketSize = Bth::kSize + kIcrcSize;

enum class ParseError : uint8_t {
  kTruncated,            // shorter than BTH + required headers + pad + ICRC
  kUnknownOpcode,        // FindOpcode() == nullptr
  kBadTransportVersion,  // BTH.TVer != 0: version 0 is the only one defined (IBTA 9.2); receivers drop others
  kPadTooLong,           // pad count exceeds the bytes between headers and ICRC, or pad on an opcode without payload
  kPayloadUnexpected,    // bytes between headers and ICRC for an opcode that carries no payload
  kBadPayloadLength,     // payload size differs from the opcode's fixed size (CNP: 16)
  kMisaligned,           // payload + pad is not a multiple of 4 bytes (IBTA 9.2: PadCnt aligns to 4)
};
std::string_view ToString(ParseError error);

enum class EncodeError : uint8_t {
  kUnknownOpcode,      // spec.bth.opcode is not in the table
  kMissingHeader,      // the opcode requires an extension header the spec does not supply
  kPayloadUnexpected,  // non-empty payload for an opcode that carries none
  kBadPayloadLength,   // payload size differs from the opcode's fixed size
  kBufferTooSmall,     // `out` is shorter than EncodedLength()
  kPayloadUnreadable,  // the copy function refused a piece of the payload (memory the program no longer maps)
};
std::string_view ToString(EncodeError error);

// A parsed packet. Spans point into the parsed buffer and live as long as it does. Exactly the extension headers
// named by info->headers are engaged.
struct PacketView {
  Bth bth;
  const OpcodeInfo* info = nullptr;  // never null in a successful parse
  std::optional<Rdeth> rdeth;
  std::optional<Deth> deth;
  std::optional<XrcEth> xrc;
  std::optional<Reth> reth;
  std::optional<AtomicEth> atomic;
  std::optional<Aeth> aeth;
  std::optional<AtomicAckEth> atomic_ack;
  std::optional<ImmDt> imm;
  std::optional<Ieth> ieth;
  std::span<const uint8_t> payload;  // excludes the pad
  std::span<const uint8_t> pad;      // bth.pad_count bytes (normally zeros; not checked)
  uint32_t icrc = 0;                 // the last 4 bytes read little-endian: the value ComputeIcrc returns
  std::span<const uint8_t> bytes;    // the whole packet, BTH through ICRC
};

// Parses a UDP payload (BTH through ICRC). Does not verify the ICRC.
Expected<PacketView, ParseError> ParsePacket(std::span<const uint8_t> udp_payload);

// What a sender wants in a packet. Only the headers the opcode requires are read; others are ignored.
// bth.pad_count is ignored (computed from the payload); bth.transport_version is written as 0.
struct PacketSpec {
  Bth bth;
  std::optional<Rdeth> rdeth;
  std::optional<Deth> deth;
  std::optional<XrcEth> xrc;
  std::optional<Reth> reth;
  std::optional<AtomicEth> atomic;
  std::optional<Aeth> aeth;
  std::optional<AtomicAckEth> atomic_ack;
  std::optional<ImmDt> imm;
  std::optional<Ieth> ieth;
};

// The spec that re-encodes `view` (headers as parsed; the caller passes view.payload as payload).
PacketSpec SpecFromView(const PacketView& view);

// Pad bytes needed after `payload_len` bytes of payload: (-payload_len) mod 4.
inline uint8_t PadFor(size_t payload_len) { return static_cast<uint8_t>((4 - (payload_len & 3)) & 3); }

// Bytes EncodePacket writes for this spec and payload size: BTH + headers + payload + pad + ICRC. When the opcode
// is unknown, counts BTH + payload + pad + ICRC (EncodePacket will fail anyway).
size_t EncodedLength(const PacketSpec& spec, size_t payload_len);

// Writes BTH (pad_count computed, TVer 0), the extension headers the opcode requires, payload, zero pad and a zero
// ICRC into the front of `out`. Returns the number of bytes written (== EncodedLength). The caller then seals the
// ICRC with SealIcrc(flow, out.first(n)).
Expected<size_t, EncodeError> EncodePacket(const PacketSpec& spec, std::span<const uint8_t> payload,
                                           std::span<uint8_t> out);
// The same with the payload gathered from `pieces`, in order (a message's bytes straight from registered memory:
// one copy, into `out`), each piece copied by `copy` when one is given (false: kPayloadUnreadable), else memcpy.
using PieceCopy = bool (*)(void* dst, const void* src, size_t n);
Expected<size_t, EncodeError> EncodePacketGathered(const PacketSpec& spec,
                                                   std::span<const std::span<const uint8_t>> pieces,
                                                   std::span<uint8_t> out, PieceCopy copy = nullptr);

}  // namespace uroce::wire
