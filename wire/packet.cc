#include "wire/packet.h"

#include <cstring>

#include "wire/bytes.h"

namespace uroce::wire {

std::string_view ToString(ParseError error) {
  switch (error) {
    case ParseError::kTruncated: return "truncated";
    case ParseError::kUnknownOpcode: return "unknown opcode";
    case ParseError::kBadTransportVersion: return "bad transport version";
    case ParseError::kPadTooLong: return "pad too long";
    case ParseError::kPayloadUnexpected: return "payload unexpected";
    case ParseError::kBadPayloadLength: return "bad payload length";
    case ParseError::kMisaligned: return "payload not 4-byte aligned";
  }
  return "?";
}

std::string_view ToString(EncodeError error) {
  switch (error) {
    case EncodeError::kUnknownOpcode: return "unknown opcode";
    case EncodeError::kMissingHeader: return "missing extension header";
    case EncodeError::kPayloadUnexpected: return "payload unexpected";
    case EncodeError::kBadPayloadLength: return "bad payload length";
    case EncodeError::kBufferTooSmall: return "buffer too small";
    case EncodeError::kPayloadUnreadable: return "payload unreadable";
  }
  return "?";
}

Expected<PacketView, ParseError> ParsePacket(std::span<const uint8_t> udp_payload) {
  const size_t size = udp_payload.size();
  if (size < kMinPacketSize) return Unexpected(ParseError::kTruncated);
  const uint8_t* p = udp_payload.data();

  PacketView v;
  v.bth = Bth::Decode(p);
  v.info = FindOpcode(v.bth.opcode);
  if (v.info == nullptr) return Unexpected(ParseError::kUnknownOpcode);
  // IBTA Vol 1 9.2 (BTH TVer): 0 is the only defined transport header version; rxe drops other versions too.
  if (v.bth.transport_version != 0) return Unexpected(ParseError::kBadTransportVersion);

  const uint32_t headers = v.info->headers;
  const size_t header_end = Bth::kSize + ExtHeadersLength(headers);
  if (size < header_end + kIcrcSize) return Unexpected(ParseError::kTruncated);

  size_t off = Bth::kSize;
  auto take = [&](ExtHeader h, auto& slot) {
    if (headers & h) {
      slot = std::remove_reference_t<decltype(*slot)>::Decode(p + off);
      off += ExtHeaderSize(h);
    }
  };
  // kExtHeaderOrder: RDETH DETH XRCETH RETH AtomicETH AETH AtomicAckETH ImmDt IETH.
  take(kRdeth, v.rdeth);
  take(kDeth, v.deth);
  take(kXrcEth, v.xrc);
  take(kReth, v.reth);
  take(kAtomicEth, v.atomic);
  take(kAeth, v.aeth);
  take(kAtomicAckEth, v.atomic_ack);
  take(kImmDt, v.imm);
  take(kIeth, v.ieth);

  const size_t body = size - kIcrcSize - header_end;  // payload + pad
  const size_t pad = v.bth.pad_count;
  if (!v.info->has_payload) {
    if (pad != 0) return Unexpected(ParseError::kPadTooLong);
    if (body != 0) return Unexpected(ParseError::kPayloadUnexpected);
  } else {
    if (pad > body) return Unexpected(ParseError::kPadTooLong);
    if (body % 4 != 0) return Unexpected(ParseError::kMisaligned);
    if (v.info->fixed_payload != 0 && body - pad != v.info->fixed_payload)
      return Unexpected(ParseError::kBadPayloadLength);
  }
  v.payload = udp_payload.subspan(header_end, body - pad);
  v.pad = udp_payload.subspan(header_end + body - pad, pad);
  v.icrc = LoadLe32(p + size - kIcrcSize);
  v.bytes = udp_payload;
  return v;
}

PacketSpec SpecFromView(const PacketView& view) {
  PacketSpec s;
  s.bth = view.bth;
  s.rdeth = view.rdeth;
  s.deth = view.deth;
  s.xrc = view.xrc;
  s.reth = view.reth;
  s.atomic = view.atomic;
  s.aeth = view.aeth;
  s.atomic_ack = view.atomic_ack;
  s.imm = view.imm;
  s.ieth = view.ieth;
  return s;
}

size_t EncodedLength(const PacketSpec& spec, size_t payload_len) {
  const OpcodeInfo* info = FindOpcode(spec.bth.opcode);
  const size_t headers = info ? ExtHeadersLength(info->headers) : 0;
  return Bth::kSize + headers + payload_len + PadFor(payload_len) + kIcrcSize;
}

Expected<size_t, EncodeError> EncodePacket(const PacketSpec& spec, std::span<const uint8_t> payload,
                                           std::span<uint8_t> out) {
  return EncodePacketGathered(spec, std::span<const std::span<const uint8_t>>(&payload, 1), out);
}

Expected<size_t, EncodeError> EncodePacketGathered(const PacketSpec& spec,
                                                   std::span<const std::span<const uint8_t>> pieces,
                                                   std::span<uint8_t> out, PieceCopy copy) {
  const OpcodeInfo* info = FindOpcode(spec.bth.opcode);
  if (info == nullptr) return Unexpected(EncodeError::kUnknownOpcode);
  size_t payload_len = 0;
  for (const auto& piece : pieces) payload_len += piece.size();
  if (!info->has_payload && payload_len != 0) return Unexpected(EncodeError::kPayloadUnexpected);
  if (info->fixed_payload != 0 && payload_len != info->fixed_payload)
    return Unexpected(EncodeError::kBadPayloadLength);

  const uint32_t headers = info->headers;
  auto missing = [&](ExtHeader h, bool present) { return (headers & h) && !present; };
  if (missing(kRdeth, spec.rdeth.has_value()) || missing(kDeth, spec.deth.has_value()) ||
      missing(kXrcEth, spec.xrc.has_value()) || missing(kReth, spec.reth.has_value()) ||
      missing(kAtomicEth, spec.atomic.has_value()) || missing(kAeth, spec.aeth.has_value()) ||
      missing(kAtomicAckEth, spec.atomic_ack.has_value()) || missing(kImmDt, spec.imm.has_value()) ||
      missing(kIeth, spec.ieth.has_value()))
    return Unexpected(EncodeError::kMissingHeader);

  const uint8_t pad = PadFor(payload_len);
  const size_t total = Bth::kSize + ExtHeadersLength(headers) + payload_len + pad + kIcrcSize;
  if (out.size() < total) return Unexpected(EncodeError::kBufferTooSmall);

  uint8_t* p = out.data();
  Bth bth = spec.bth;
  bth.pad_count = pad;
  bth.transport_version = 0;
  bth.Encode(p);
  size_t off = Bth::kSize;
  auto put = [&](ExtHeader h, const auto& slot) {
    if (headers & h) {
      slot->Encode(p + off);
      off += ExtHeaderSize(h);
    }
  };
  put(kRdeth, spec.rdeth);
  put(kDeth, spec.deth);
  put(kXrcEth, spec.xrc);
  put(kReth, spec.reth);
  put(kAtomicEth, spec.atomic);
  put(kAeth, spec.aeth);
  put(kAtomicAckEth, spec.atomic_ack);
  put(kImmDt, spec.imm);
  put(kIeth, spec.ieth);
  for (const auto& piece : pieces) {
    if (!piece.empty()) {
      if (copy == nullptr) {
        std::memcpy(p + off, piece.data(), piece.size());
      } else if (!copy(p + off, piece.data(), piece.size())) {
        return Unexpected(EncodeError::kPayloadUnreadable);
      }
    }
    off += piece.size();
  }
  std::memset(p + off, 0, pad + kIcrcSize);
  return total;
}

}  // namespace uroce::wire
