// The BTH opcode table: for every defined opcode, which transport and operation it is, where it sits in a message,
// which extension headers follow the BTH and whether a payload follows them.
//
// Sources (facts only): IBTA Vol 1 table 38 "OpCode field" and section 9.2 "Base transport header" for RC, UC, RD
// and UD; Annex A14 (XRC) for opcodes 0xA0-0xB7; Annex A17 (RoCEv2) section A17.9 for the congestion notification
// packet 0x81. The opcode's high 3 bits name the transport (000 RC, 001 UC, 010 RD, 011 UD, 100 CNP, 101 XRC;
// 110 and 111 are manufacturer specific), the low 5 bits the operation.
//
// Not in the table (FindOpcode returns nullptr): reserved codes, manufacturer-specific codes 0xC0-0xFF, and the
// IBTA 1.5 additions FLUSH (0x1C) and ATOMIC_WRITE (0x1D), which need a FETH and are not implemented.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace uroce::wire {

enum class TransportKind : uint8_t { kRc, kUc, kRd, kUd, kCnp, kXrc };
std::string_view ToString(TransportKind kind);  // "RC", "UC", "RD", "UD", "CNP", "XRC"

// Extension headers that may follow the BTH, as bits of OpcodeInfo::headers. On the wire they appear in the order
// of kExtHeaderOrder (IBTA 9.2: RDETH, DETH, then XRCETH per A14, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH),
// whatever the bit values.
enum ExtHeader : uint32_t {
  kRdeth = 1u << 0,         // 4 B: reliable datagram EE context (RD only)
  kDeth = 1u << 1,          // 8 B: datagram Q_Key + source QP (UD, RD)
  kXrcEth = 1u << 2,        // 4 B: XRC target SRQ number (XRC requests)
  kReth = 1u << 3,          // 16 B: RDMA virtual address, R_Key, DMA length
  kAtomicEth = 1u << 4,     // 28 B: atomic virtual address, R_Key, swap/add, compare
  kAeth = 1u << 5,          // 4 B: ACK syndrome + MSN
  kAtomicAckEth = 1u << 6,  // 8 B: original remote data of an atomic
  kImmDt = 1u << 7,         // 4 B: immediate data
  kIeth = 1u << 8,          // 4 B: R_Key to invalidate
};

inline constexpr ExtHeader kExtHeaderOrder[] = {kRdeth, kDeth,         kXrcEth, kReth, kAtomicEth,
                                                kAeth,  kAtomicAckEth, kImmDt,  kIeth};

// Size in bytes of one extension header (a single bit), 0 for anything else.
size_t ExtHeaderSize(ExtHeader header);
// Total size of the extension headers named by the mask `headers`.
size_t ExtHeadersLength(uint32_t headers);
// "RETH", "AETH", ... for a single bit; "?" otherwise.
std::string_view ToString(ExtHeader header);

// Where a packet sits within a message. Single-packet operations (read request, acknowledge, atomics, CNP) are kOnly.
enum class MsgPosition : uint8_t { kOnly, kFirst, kMiddle, kLast };
std::string_view ToString(MsgPosition position);

enum class Operation : uint8_t {
  kSend,
  kRdmaWrite,
  kReadRequest,
  kReadResponse,
  kAcknowledge,
  kAtomicAcknowledge,
  kCompareSwap,
  kFetchAdd,
  kResync,  // RD only
  kCnp,
};
std::string_view ToString(Operation op);

struct OpcodeInfo {
  uint8_t code;
  std::string_view name;  // IBTA-style name, e.g. "RC_RDMA_READ_RESPONSE_MIDDLE", "XRC_SEND_LAST_WITH_IMMEDIATE"
  TransportKind transport;
  Operation op;
  MsgPosition position;
  uint32_t headers;  // ExtHeader bits
  bool has_payload;  // a payload (possibly of length 0) follows the extension headers
  bool has_immediate;   // == (headers & kImmDt) != 0
  bool has_invalidate;  // == (headers & kIeth) != 0
  // Sent by a requester (true) or by a responder: read responses, acknowledges (false). A CNP counts as a request:
  // it is sent to the QP that caused congestion, not in answer to a request.
  bool is_request;
  // Non-zero when the payload has a fixed size: 16 for a CNP (its 16 reserved bytes, A17.9.2).
  uint16_t fixed_payload;
};

// The table entry for `code`, or nullptr when the code is reserved, manufacturer specific or not implemented.
const OpcodeInfo* FindOpcode(uint8_t code);
// Every entry, in ascending code order.
std::span<const OpcodeInfo> AllOpcodes();
// Where packet `k` (from 0) of a message of `packets` packets sits (a message of 0 bytes is one packet).
MsgPosition PositionInMessage(uint64_t k, uint64_t packets);
// Whether a packet at `position` may carry `payload` bytes at path MTU `pmtu` (IBTA 9.7.4.1.4 / 9.8.3: a message is
// cut into PMTU-sized packets): FIRST and MIDDLE exactly the PMTU, LAST from 1 byte to the PMTU, ONLY up to it. A
// packet that does not is an invalid request at an RC responder and ends a UC message: the two ends disagree on the
// path MTU, and taking it would shift the PSNs each end counts for what follows.
bool PayloadFitsPathMtu(MsgPosition position, size_t payload, uint32_t pmtu);
// The opcode of the packet at `position` in a message of `op` on `transport`, its last (or only) packet carrying
// immediate data or an IETH as asked (ignored for FIRST and MIDDLE packets): the table's entry, looked up in a
// compile-time index. nullopt when the transport does not define it (UC has no READ, UD no WRITE, nothing has both
// an ImmDt and an IETH).
std::optional<uint8_t> MessageOpcode(TransportKind transport, Operation op, MsgPosition position,
                                     bool immediate = false, bool invalidate = false);

// Opcode constants for the codes the engine builds most; the table is the authority for everything else.
namespace opcode {
inline constexpr uint8_t kRcSendFirst = 0x00;
inline constexpr uint8_t kRcSendMiddle = 0x01;
inline constexpr uint8_t kRcSendLast = 0x02;
inline constexpr uint8_t kRcSendLastWithImmediate = 0x03;
inline constexpr uint8_t kRcSendOnly = 0x04;
inline constexpr uint8_t kRcSendOnlyWithImmediate = 0x05;
inline constexpr uint8_t kRcRdmaWriteFirst = 0x06;
inline constexpr uint8_t kRcRdmaWriteMiddle = 0x07;
inline constexpr uint8_t kRcRdmaWriteLast = 0x08;
inline constexpr uint8_t kRcRdmaWriteLastWithImmediate = 0x09;
inline constexpr uint8_t kRcRdmaWriteOnly = 0x0A;
inline constexpr uint8_t kRcRdmaWriteOnlyWithImmediate = 0x0B;
inline constexpr uint8_t kRcRdmaReadRequest = 0x0C;
inline constexpr uint8_t kRcRdmaReadResponseFirst = 0x0D;
inline constexpr uint8_t kRcRdmaReadResponseMiddle = 0x0E;
inline constexpr uint8_t kRcRdmaReadResponseLast = 0x0F;
inline constexpr uint8_t kRcRdmaReadResponseOnly = 0x10;
inline constexpr uint8_t kRcAcknowledge = 0x11;
inline constexpr uint8_t kRcAtomicAcknowledge = 0x12;
inline constexpr uint8_t kRcCompareSwap = 0x13;
inline constexpr uint8_t kRcFetchAdd = 0x14;
inline constexpr uint8_t kRcSendLastWithInvalidate = 0x16;
inline constexpr uint8_t kRcSendOnlyWithInvalidate = 0x17;
inline constexpr uint8_t kUdSendOnly = 0x64;
inline constexpr uint8_t kUdSendOnlyWithImmediate = 0x65;
inline constexpr uint8_t kCnp = 0x81;
// Transport base codes: an RC opcode's low 5 bits plus one of these gives the same operation on another transport
// (where that transport defines it).
inline constexpr uint8_t kRcBase = 0x00;
inline constexpr uint8_t kUcBase = 0x20;
inline constexpr uint8_t kRdBase = 0x40;
inline constexpr uint8_t kUdBase = 0x60;
inline constexpr uint8_t kXrcBase = 0xA0;
}  // namespace opcode

}  // namespace uroce::wire
