#include "wire/headers.h"

#include <array>
#include <cstdio>
#include <cstring>

#include "wire/bytes.h"

namespace uroce::wire {

void Bth::Encode(uint8_t* out) const {
  out[0] = opcode;
  out[1] = static_cast<uint8_t>((solicited ? 0x80 : 0) | (mig_req ? 0x40 : 0) | ((pad_count & 3) << 4) |
                                (transport_version & 0x0F));
  StoreBe16(out + 2, pkey);
  out[4] = static_cast<uint8_t>((fecn ? 0x80 : 0) | (becn ? 0x40 : 0) | (reserved6 & 0x3F));
  StoreBe24(out + 5, dest_qp & kMask24);
  out[8] = static_cast<uint8_t>((ack_req ? 0x80 : 0) | (reserved7 & 0x7F));
  StoreBe24(out + 9, psn & kMask24);
}

Bth Bth::Decode(const uint8_t* in) {
  Bth b;
  b.opcode = in[0];
  b.solicited = in[1] & 0x80;
  b.mig_req = in[1] & 0x40;
  b.pad_count = (in[1] >> 4) & 3;
  b.transport_version = in[1] & 0x0F;
  b.pkey = LoadBe16(in + 2);
  b.fecn = in[4] & 0x80;
  b.becn = in[4] & 0x40;
  b.reserved6 = in[4] & 0x3F;
  b.dest_qp = LoadBe24(in + 5);
  b.ack_req = in[8] & 0x80;
  b.reserved7 = in[8] & 0x7F;
  b.psn = LoadBe24(in + 9);
  return b;
}

void Reth::Encode(uint8_t* out) const {
  StoreBe64(out, va);
  StoreBe32(out + 8, rkey);
  StoreBe32(out + 12, dma_length);
}

Reth Reth::Decode(const uint8_t* in) { return Reth{LoadBe64(in), LoadBe32(in + 8), LoadBe32(in + 12)}; }

std::string_view ToString(AethKind kind) {
  switch (kind) {
    case AethKind::kAck: return "ACK";
    case AethKind::kRnrNak: return "RNR NAK";
    case AethKind::kReserved: return "reserved";
    case AethKind::kNak: return "NAK";
  }
  return "?";
}

std::string_view ToString(NakCode code) {
  switch (code) {
    case NakCode::kPsnSeqError: return "PSN sequence error";
    case NakCode::kInvalidRequest: return "invalid request";
    case NakCode::kRemoteAccessError: return "remote access error";
    case NakCode::kRemoteOperationalError: return "remote operational error";
    case NakCode::kInvalidRdRequest: return "invalid RD request";
  }
  return "reserved";
}

uint32_t RnrTimerMicros(uint8_t code) {
  // IBTA Vol 1 table 45 "Encoding for RNR NAK timer field", in microseconds. Code 0 is the longest wait.
  static constexpr std::array<uint32_t, 32> kMicros = {
      655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,    320,
      480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240,  15360,
      20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
  };
  return kMicros[code & 0x1F];
}

// Syndrome layout (IBTA 9.3.5): bit 7 reserved (0), bits 6-5 kind, bits 4-0 credit count / timer / NAK code.
Aeth Aeth::Ack(uint8_t credits, uint32_t msn) {
  return Aeth{static_cast<uint8_t>(credits & 0x1F), msn & kMask24};
}
Aeth Aeth::RnrNak(uint8_t timer_code, uint32_t msn) {
  return Aeth{static_cast<uint8_t>(0x20 | (timer_code & 0x1F)), msn & kMask24};
}
Aeth Aeth::Nak(NakCode code, uint32_t msn) {
  return Aeth{static_cast<uint8_t>(0x60 | (static_cast<uint8_t>(code) & 0x1F)), msn & kMask24};
}

std::string Aeth::ToString() const {
  char buf[96];
  switch (kind()) {
    case AethKind::kAck:
      if (credit_count() == kInvalidCredits)
        std::snprintf(buf, sizeof buf, "ACK credits=invalid msn=%u", msn);
      else
        std::snprintf(buf, sizeof buf, "ACK credits=%u msn=%u", credit_count(), msn);
      break;
    case AethKind::kRnrNak: {
      uint32_t us = RnrTimerMicros(rnr_timer());
      std::snprintf(buf, sizeof buf, "RNR NAK timer=%u (%u.%02u ms) msn=%u", rnr_timer(), us / 1000,
                    (us % 1000) / 10, msn);
      break;
    }
    case AethKind::kNak: {
      std::string_view what = wire::ToString(nak_code());
      std::snprintf(buf, sizeof buf, "NAK %.*s (code %u) msn=%u", static_cast<int>(what.size()), what.data(),
                    syndrome & 0x1F, msn);
      break;
    }
    default:
      std::snprintf(buf, sizeof buf, "reserved syndrome 0x%02x msn=%u", syndrome, msn);
      break;
  }
  return buf;
}

void Aeth::Encode(uint8_t* out) const {
  out[0] = syndrome;
  StoreBe24(out + 1, msn & kMask24);
}
Aeth Aeth::Decode(const uint8_t* in) { return Aeth{in[0], LoadBe24(in + 1)}; }

void AtomicEth::Encode(uint8_t* out) const {
  StoreBe64(out, va);
  StoreBe32(out + 8, rkey);
  StoreBe64(out + 12, swap_add);
  StoreBe64(out + 20, compare);
}
AtomicEth AtomicEth::Decode(const uint8_t* in) {
  return AtomicEth{LoadBe64(in), LoadBe32(in + 8), LoadBe64(in + 12), LoadBe64(in + 20)};
}

void AtomicAckEth::Encode(uint8_t* out) const { StoreBe64(out, original); }
AtomicAckEth AtomicAckEth::Decode(const uint8_t* in) { return AtomicAckEth{LoadBe64(in)}; }

void Deth::Encode(uint8_t* out) const {
  StoreBe32(out, qkey);
  out[4] = reserved;
  StoreBe24(out + 5, src_qp & kMask24);
}
Deth Deth::Decode(const uint8_t* in) { return Deth{LoadBe32(in), in[4], LoadBe24(in + 5)}; }

void ImmDt::Encode(uint8_t* out) const { std::memcpy(out, &imm, 4); }
ImmDt ImmDt::Decode(const uint8_t* in) {
  ImmDt d;
  std::memcpy(&d.imm, in, 4);
  return d;
}

void Ieth::Encode(uint8_t* out) const { StoreBe32(out, rkey); }
Ieth Ieth::Decode(const uint8_t* in) { return Ieth{LoadBe32(in)}; }

void XrcEth::Encode(uint8_t* out) const {
  out[0] = reserved;
  StoreBe24(out + 1, srqn & kMask24);
}
XrcEth XrcEth::Decode(const uint8_t* in) { return XrcEth{in[0], LoadBe24(in + 1)}; }

void Rdeth::Encode(uint8_t* out) const {
  out[0] = reserved;
  StoreBe24(out + 1, eecn & kMask24);
}
Rdeth Rdeth::Decode(const uint8_t* in) { return Rdeth{in[0], LoadBe24(in + 1)}; }

}  // namespace uroce::wire
