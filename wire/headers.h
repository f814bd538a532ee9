// Codecs for the RoCEv2 transport headers: the BTH and every extension header (IBTA Vol 1 section 9.2-9.3;
// XRCETH from Annex A14). Each struct holds host-order field values and has
//   static constexpr size_t kSize;            // bytes on the wire
//   void Encode(uint8_t* out) const;         // writes exactly kSize bytes
//   static T Decode(const uint8_t* in);      // reads exactly kSize bytes
// Encode/Decode never check lengths: the caller (packet.cc) has. 24-bit fields (PSN, QPN, SRQN, MSN, EECN) are
// masked to 24 bits on encode and decode. Reserved bits are kept in `reserved*` fields so that decoding and
// re-encoding reproduces the input bit for bit; a sender leaves them 0 (IBTA: transmitted as 0, ignored on receipt).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace uroce::wire {

inline constexpr uint32_t kMask24 = 0xFFFFFF;
// IBTA 10.5.2.3: the destination QPN of a UD packet to a multicast group (every QP attached to it receives it).
inline constexpr uint32_t kMulticastQpn = 0xFFFFFF;
inline constexpr uint16_t kDefaultPkey = 0xFFFF;  // IBTA 10.9.1.2: default partition, full membership.

// Base Transport Header, 12 bytes (IBTA 9.2):
//   byte 0  opcode
//   byte 1  SE(1) M(1) PadCnt(2) TVer(4)
//   2-3     P_Key
//   byte 4  FECN(1) BECN(1) Resv6(6)    (RoCEv2 A17.3.3: masked to all 1s for the ICRC)
//   5-7     DestQP
//   byte 8  AckReq(1) Resv7(7)
//   9-11    PSN
struct Bth {
  static constexpr size_t kSize = 12;

  uint8_t opcode = 0;
  bool solicited = false;
  bool mig_req = false;
  uint8_t pad_count = 0;          // 0..3 bytes of pad before the ICRC
  uint8_t transport_version = 0;  // 0 is the only defined version
  uint16_t pkey = kDefaultPkey;
  bool fecn = false;
  bool becn = false;
  uint8_t reserved6 = 0;  // low 6 bits of byte 4
  uint32_t dest_qp = 0;   // 24 bits
  bool ack_req = false;
  uint8_t reserved7 = 0;  // low 7 bits of byte 8
  uint32_t psn = 0;       // 24 bits

  void Encode(uint8_t* out) const;
  static Bth Decode(const uint8_t* in);
  bool operator==(const Bth&) const = default;
};

// RDMA Extended Transport Header, 16 bytes (9.3.3): carried by RDMA WRITE first/only and READ requests.
struct Reth {
  static constexpr size_t kSize = 16;
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t dma_length = 0;

  void Encode(uint8_t* out) const;
  static Reth Decode(const uint8_t* in);
  bool operator==(const Reth&) const = default;
};

// AETH syndrome bits 6-5 (IBTA 9.3.5, table 42). Bit 7 is reserved.
enum class AethKind : uint8_t { kAck = 0, kRnrNak = 1, kReserved = 2, kNak = 3 };
std::string_view ToString(AethKind kind);

// NAK codes in the syndrome's low 5 bits when the kind is kNak (table 44). Other values are reserved.
enum class NakCode : uint8_t {
  kPsnSeqError = 0,
  kInvalidRequest = 1,
  kRemoteAccessError = 2,
  kRemoteOperationalError = 3,
  kInvalidRdRequest = 4,
};
std::string_view ToString(NakCode code);  // "PSN sequence error", ...; "reserved" for undefined values

// Credit count value meaning "no credit count" (end-to-end credits not used / unlimited), IBTA 9.7.7.2.
inline constexpr uint8_t kInvalidCredits = 31;

// The RNR timer code (5 bits, table 45) converted to microseconds: 0 is 655.36 ms, 1 is 0.01 ms, ..., 31 is
// 491.52 ms. Codes above 31 use their low 5 bits.
uint32_t RnrTimerMicros(uint8_t code);

// ACK Extended Transport Header, 4 bytes (9.3.5): syndrome + 24-bit MSN.
struct Aeth {
  static constexpr size_t kSize = 4;
  uint8_t syndrome = 0;
  uint32_t msn = 0;  // 24 bits

  static Aeth Ack(uint8_t credits, uint32_t msn);            // credits 0..31 (31 = kInvalidCredits)
  static Aeth RnrNak(uint8_t timer_code, uint32_t msn);      // timer code 0..31, see RnrTimerMicros
  static Aeth Nak(NakCode code, uint32_t msn);

  AethKind kind() const { return static_cast<AethKind>((syndrome >> 5) & 3); }
  uint8_t credit_count() const { return syndrome & 0x1F; }  // meaningful when kind() == kAck
  uint8_t rnr_timer() const { return syndrome & 0x1F; }     // meaningful when kind() == kRnrNak
  NakCode nak_code() const { return static_cast<NakCode>(syndrome & 0x1F); }  // when kind() == kNak
  // "ACK credits=5 msn=17", "RNR NAK timer=14 (1.28 ms) msn=3", "NAK remote access error msn=9",
  // "reserved syndrome 0x45 msn=0".
  std::string ToString() const;

  void Encode(uint8_t* out) const;
  static Aeth Decode(const uint8_t* in);
  bool operator==(const Aeth&) const = default;
};

// Atomic Extended Transport Header, 28 bytes (9.3.4): CmpSwap and FetchAdd requests.
struct AtomicEth {
  static constexpr size_t kSize = 28;
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint64_t swap_add = 0;  // swap value (CmpSwap) or add value (FetchAdd)
  uint64_t compare = 0;   // compare value (CmpSwap); FetchAdd ignores it

  void Encode(uint8_t* out) const;
  static AtomicEth Decode(const uint8_t* in);
  bool operator==(const AtomicEth&) const = default;
};

// Atomic Acknowledge Extended Transport Header, 8 bytes (9.3.6): the remote data before the atomic.
struct AtomicAckEth {
  static constexpr size_t kSize = 8;
  uint64_t original = 0;

  void Encode(uint8_t* out) const;
  static AtomicAckEth Decode(const uint8_t* in);
  bool operator==(const AtomicAckEth&) const = default;
};

// Datagram Extended Transport Header, 8 bytes (9.3.2): Q_Key, reserved byte, source QP.
struct Deth {
  static constexpr size_t kSize = 8;
  uint32_t qkey = 0;
  uint8_t reserved = 0;
  uint32_t src_qp = 0;  // 24 bits

  void Encode(uint8_t* out) const;
  static Deth Decode(const uint8_t* in);
  bool operator==(const Deth&) const = default;
};

// Immediate Data, 4 bytes (9.3.7). `imm` holds the 4 wire bytes exactly as they appear in network order, loaded
// into a uint32_t by memcpy -- the same representation as ibv_send_wr::imm_data / ibv_wc::imm_data (__be32). So a
// verbs layer copies it through without byte swapping; on a little-endian host the numeric value is byte-swapped
// relative to a big-endian reading of the wire.
struct ImmDt {
  static constexpr size_t kSize = 4;
  uint32_t imm = 0;  // network byte order, see above

  void Encode(uint8_t* out) const;
  static ImmDt Decode(const uint8_t* in);
  bool operator==(const ImmDt&) const = default;
};

// Invalidate Extended Transport Header, 4 bytes (9.3.8): the R_Key to invalidate (SEND with invalidate).
struct Ieth {
  static constexpr size_t kSize = 4;
  uint32_t rkey = 0;

  void Encode(uint8_t* out) const;
  static Ieth Decode(const uint8_t* in);
  bool operator==(const Ieth&) const = default;
};

// XRC Extended Transport Header, 4 bytes (Annex A14): reserved byte + 24-bit XRC SRQ number at the target.
struct XrcEth {
  static constexpr size_t kSize = 4;
  uint8_t reserved = 0;
  uint32_t srqn = 0;  // 24 bits

  void Encode(uint8_t* out) const;
  static XrcEth Decode(const uint8_t* in);
  bool operator==(const XrcEth&) const = default;
};

// Reliable Datagram Extended Transport Header, 4 bytes (9.3.1): reserved byte + 24-bit EE context number.
struct Rdeth {
  static constexpr size_t kSize = 4;
  uint8_t reserved = 0;
  uint32_t eecn = 0;  // 24 bits

  void Encode(uint8_t* out) const;
  static Rdeth Decode(const uint8_t* in);
  bool operator==(const Rdeth&) const = default;
};

}  // namespace uroce::wire
