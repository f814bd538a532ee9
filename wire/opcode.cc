#include "wire/opcode.h"

#include <array>

namespace uroce::wire {
namespace {

using T = TransportKind;
using O = Operation;
using P = MsgPosition;

// Requests and responses differ only by operation: responses are read responses and (atomic) acknowledges.
constexpr bool IsRequest(Operation op) {
  return op != O::kReadResponse && op != O::kAcknowledge && op != O::kAtomicAcknowledge;
}

constexpr OpcodeInfo Op(uint8_t code, std::string_view name, T transport, O op, P position, uint32_t headers,
                        bool payload, uint16_t fixed_payload = 0) {
  return OpcodeInfo{code,
                    name,
                    transport,
                    op,
                    position,
                    headers,
                    payload,
                    (headers & kImmDt) != 0,
                    (headers & kIeth) != 0,
                    IsRequest(op),
                    fixed_payload};
}

// IBTA Vol 1 table 38 (RC, UC, RD, UD), Annex A17.9 (CNP), Annex A14 (XRC). Header lists per section 9.2 /
// table 39 "headers by opcode"; rxe's rxe_opcode.c agrees for RC, UC, RD and UD.
// RD packets carry RDETH first, and DETH on requests (not on responses).
// XRC requests carry XRCETH right after the BTH; XRC responses are identical to RC responses.
constexpr uint32_t kRd = kRdeth | kDeth;
constexpr auto kTable = std::to_array<OpcodeInfo>({
    // Reliable Connection, 0x00-0x17.
    Op(0x00, "RC_SEND_FIRST", T::kRc, O::kSend, P::kFirst, 0, true),
    Op(0x01, "RC_SEND_MIDDLE", T::kRc, O::kSend, P::kMiddle, 0, true),
    Op(0x02, "RC_SEND_LAST", T::kRc, O::kSend, P::kLast, 0, true),
    Op(0x03, "RC_SEND_LAST_WITH_IMMEDIATE", T::kRc, O::kSend, P::kLast, kImmDt, true),
    Op(0x04, "RC_SEND_ONLY", T::kRc, O::kSend, P::kOnly, 0, true),
    Op(0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", T::kRc, O::kSend, P::kOnly, kImmDt, true),
    Op(0x06, "RC_RDMA_WRITE_FIRST", T::kRc, O::kRdmaWrite, P::kFirst, kReth, true),
    Op(0x07, "RC_RDMA_WRITE_MIDDLE", T::kRc, O::kRdmaWrite, P::kMiddle, 0, true),
    Op(0x08, "RC_RDMA_WRITE_LAST", T::kRc, O::kRdmaWrite, P::kLast, 0, true),
    Op(0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", T::kRc, O::kRdmaWrite, P::kLast, kImmDt, true),
    Op(0x0A, "RC_RDMA_WRITE_ONLY", T::kRc, O::kRdmaWrite, P::kOnly, kReth, true),
    Op(0x0B, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", T::kRc, O::kRdmaWrite, P::kOnly, kReth | kImmDt, true),
    Op(0x0C, "RC_RDMA_READ_REQUEST", T::kRc, O::kReadRequest, P::kOnly, kReth, false),
    Op(0x0D, "RC_RDMA_READ_RESPONSE_FIRST", T::kRc, O::kReadResponse, P::kFirst, kAeth, true),
    Op(0x0E, "RC_RDMA_READ_RESPONSE_MIDDLE", T::kRc, O::kReadResponse, P::kMiddle, 0, true),
    Op(0x0F, "RC_RDMA_READ_RESPONSE_LAST", T::kRc, O::kReadResponse, P::kLast, kAeth, true),
    Op(0x10, "RC_RDMA_READ_RESPONSE_ONLY", T::kRc, O::kReadResponse, P::kOnly, kAeth, true),
    Op(0x11, "RC_ACKNOWLEDGE", T::kRc, O::kAcknowledge, P::kOnly, kAeth, false),
    Op(0x12, "RC_ATOMIC_ACKNOWLEDGE", T::kRc, O::kAtomicAcknowledge, P::kOnly, kAeth | kAtomicAckEth, false),
    Op(0x13, "RC_COMPARE_SWAP", T::kRc, O::kCompareSwap, P::kOnly, kAtomicEth, false),
    Op(0x14, "RC_FETCH_ADD", T::kRc, O::kFetchAdd, P::kOnly, kAtomicEth, false),
    Op(0x16, "RC_SEND_LAST_WITH_INVALIDATE", T::kRc, O::kSend, P::kLast, kIeth, true),
    Op(0x17, "RC_SEND_ONLY_WITH_INVALIDATE", T::kRc, O::kSend, P::kOnly, kIeth, true),

    // Unreliable Connection, 0x20-0x2B: sends and writes only.
    Op(0x20, "UC_SEND_FIRST", T::kUc, O::kSend, P::kFirst, 0, true),
    Op(0x21, "UC_SEND_MIDDLE", T::kUc, O::kSend, P::kMiddle, 0, true),
    Op(0x22, "UC_SEND_LAST", T::kUc, O::kSend, P::kLast, 0, true),
    Op(0x23, "UC_SEND_LAST_WITH_IMMEDIATE", T::kUc, O::kSend, P::kLast, kImmDt, true),
    Op(0x24, "UC_SEND_ONLY", T::kUc, O::kSend, P::kOnly, 0, true),
    Op(0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", T::kUc, O::kSend, P::kOnly, kImmDt, true),
    Op(0x26, "UC_RDMA_WRITE_FIRST", T::kUc, O::kRdmaWrite, P::kFirst, kReth, true),
    Op(0x27, "UC_RDMA_WRITE_MIDDLE", T::kUc, O::kRdmaWrite, P::kMiddle, 0, true),
    Op(0x28, "UC_RDMA_WRITE_LAST", T::kUc, O::kRdmaWrite, P::kLast, 0, true),
    Op(0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", T::kUc, O::kRdmaWrite, P::kLast, kImmDt, true),
    Op(0x2A, "UC_RDMA_WRITE_ONLY", T::kUc, O::kRdmaWrite, P::kOnly, kReth, true),
    Op(0x2B, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", T::kUc, O::kRdmaWrite, P::kOnly, kReth | kImmDt, true),

    // Reliable Datagram, 0x40-0x55 (decoded for completeness; uroce does not implement RD QPs).
    Op(0x40, "RD_SEND_FIRST", T::kRd, O::kSend, P::kFirst, kRd, true),
    Op(0x41, "RD_SEND_MIDDLE", T::kRd, O::kSend, P::kMiddle, kRd, true),
    Op(0x42, "RD_SEND_LAST", T::kRd, O::kSend, P::kLast, kRd, true),
    Op(0x43, "RD_SEND_LAST_WITH_IMMEDIATE", T::kRd, O::kSend, P::kLast, kRd | kImmDt, true),
    Op(0x44, "RD_SEND_ONLY", T::kRd, O::kSend, P::kOnly, kRd, true),
    Op(0x45, "RD_SEND_ONLY_WITH_IMMEDIATE", T::kRd, O::kSend, P::kOnly, kRd | kImmDt, true),
    Op(0x46, "RD_RDMA_WRITE_FIRST", T::kRd, O::kRdmaWrite, P::kFirst, kRd | kReth, true),
    Op(0x47, "RD_RDMA_WRITE_MIDDLE", T::kRd, O::kRdmaWrite, P::kMiddle, kRd, true),
    Op(0x48, "RD_RDMA_WRITE_LAST", T::kRd, O::kRdmaWrite, P::kLast, kRd, true),
    Op(0x49, "RD_RDMA_WRITE_LAST_WITH_IMMEDIATE", T::kRd, O::kRdmaWrite, P::kLast, kRd | kImmDt, true),
    Op(0x4A, "RD_RDMA_WRITE_ONLY", T::kRd, O::kRdmaWrite, P::kOnly, kRd | kReth, true),
    Op(0x4B, "RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE", T::kRd, O::kRdmaWrite, P::kOnly, kRd | kReth | kImmDt, true),
    Op(0x4C, "RD_RDMA_READ_REQUEST", T::kRd, O::kReadRequest, P::kOnly, kRd | kReth, false),
    Op(0x4D, "RD_RDMA_READ_RESPONSE_FIRST", T::kRd, O::kReadResponse, P::kFirst, kRdeth | kAeth, true),
    Op(0x4E, "RD_RDMA_READ_RESPONSE_MIDDLE", T::kRd, O::kReadResponse, P::kMiddle, kRdeth, true),
    Op(0x4F, "RD_RDMA_READ_RESPONSE_LAST", T::kRd, O::kReadResponse, P::kLast, kRdeth | kAeth, true),
    Op(0x50, "RD_RDMA_READ_RESPONSE_ONLY", T::kRd, O::kReadResponse, P::kOnly, kRdeth | kAeth, true),
    Op(0x51, "RD_ACKNOWLEDGE", T::kRd, O::kAcknowledge, P::kOnly, kRdeth | kAeth, false),
    Op(0x52, "RD_ATOMIC_ACKNOWLEDGE", T::kRd, O::kAtomicAcknowledge, P::kOnly, kRdeth | kAeth | kAtomicAckEth,
       false),
    Op(0x53, "RD_COMPARE_SWAP", T::kRd, O::kCompareSwap, P::kOnly, kRd | kAtomicEth, false),
    Op(0x54, "RD_FETCH_ADD", T::kRd, O::kFetchAdd, P::kOnly, kRd | kAtomicEth, false),
    Op(0x55, "RD_RESYNC", T::kRd, O::kResync, P::kOnly, kRd, false),

    // Unreliable Datagram, 0x64-0x65.
    Op(0x64, "UD_SEND_ONLY", T::kUd, O::kSend, P::kOnly, kDeth, true),
    Op(0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", T::kUd, O::kSend, P::kOnly, kDeth | kImmDt, true),

    // RoCEv2 congestion notification packet (A17.9.2): BTH, 16 reserved bytes, ICRC.
    Op(0x81, "CNP", T::kCnp, O::kCnp, P::kOnly, 0, true, 16),

    // Extended Reliable Connection, 0xA0-0xB7 (Annex A14): RC's operations, requests with XRCETH.
    Op(0xA0, "XRC_SEND_FIRST", T::kXrc, O::kSend, P::kFirst, kXrcEth, true),
    Op(0xA1, "XRC_SEND_MIDDLE", T::kXrc, O::kSend, P::kMiddle, kXrcEth, true),
    Op(0xA2, "XRC_SEND_LAST", T::kXrc, O::kSend, P::kLast, kXrcEth, true),
    Op(0xA3, "XRC_SEND_LAST_WITH_IMMEDIATE", T::kXrc, O::kSend, P::kLast, kXrcEth | kImmDt, true),
    Op(0xA4, "XRC_SEND_ONLY", T::kXrc, O::kSend, P::kOnly, kXrcEth, true),
    Op(0xA5, "XRC_SEND_ONLY_WITH_IMMEDIATE", T::kXrc, O::kSend, P::kOnly, kXrcEth | kImmDt, true),
    Op(0xA6, "XRC_RDMA_WRITE_FIRST", T::kXrc, O::kRdmaWrite, P::kFirst, kXrcEth | kReth, true),
    Op(0xA7, "XRC_RDMA_WRITE_MIDDLE", T::kXrc, O::kRdmaWrite, P::kMiddle, kXrcEth, true),
    Op(0xA8, "XRC_RDMA_WRITE_LAST", T::kXrc, O::kRdmaWrite, P::kLast, kXrcEth, true),
    Op(0xA9, "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE", T::kXrc, O::kRdmaWrite, P::kLast, kXrcEth | kImmDt, true),
    Op(0xAA, "XRC_RDMA_WRITE_ONLY", T::kXrc, O::kRdmaWrite, P::kOnly, kXrcEth | kReth, true),
    Op(0xAB, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", T::kXrc, O::kRdmaWrite, P::kOnly, kXrcEth | kReth | kImmDt,
       true),
    Op(0xAC, "XRC_RDMA_READ_REQUEST", T::kXrc, O::kReadRequest, P::kOnly, kXrcEth | kReth, false),
    Op(0xAD, "XRC_RDMA_READ_RESPONSE_FIRST", T::kXrc, O::kReadResponse, P::kFirst, kAeth, true),
    Op(0xAE, "XRC_RDMA_READ_RESPONSE_MIDDLE", T::kXrc, O::kReadResponse, P::kMiddle, 0, true),
    Op(0xAF, "XRC_RDMA_READ_RESPONSE_LAST", T::kXrc, O::kReadResponse, P::kLast, kAeth, true),
    Op(0xB0, "XRC_RDMA_READ_RESPONSE_ONLY", T::kXrc, O::kReadResponse, P::kOnly, kAeth, true),
    Op(0xB1, "XRC_ACKNOWLEDGE", T::kXrc, O::kAcknowledge, P::kOnly, kAeth, false),
    Op(0xB2, "XRC_ATOMIC_ACKNOWLEDGE", T::kXrc, O::kAtomicAcknowledge, P::kOnly, kAeth | kAtomicAckEth, false),
    Op(0xB3, "XRC_COMPARE_SWAP", T::kXrc, O::kCompareSwap, P::kOnly, kXrcEth | kAtomicEth, false),
    Op(0xB4, "XRC_FETCH_ADD", T::kXrc, O::kFetchAdd, P::kOnly, kXrcEth | kAtomicEth, false),
    Op(0xB6, "XRC_SEND_LAST_WITH_INVALIDATE", T::kXrc, O::kSend, P::kLast, kXrcEth | kIeth, true),
    Op(0xB7, "XRC_SEND_ONLY_WITH_INVALIDATE", T::kXrc, O::kSend, P::kOnly, kXrcEth | kIeth, true),
});

// code -> index into kTable + 1 (0 = not defined), built at compile time.
constexpr std::array<uint8_t, 256> BuildIndex() {
  std::array<uint8_t, 256> index{};
  for (size_t i = 0; i < kTable.size(); ++i) index[kTable[i].code] = static_cast<uint8_t>(i + 1);
  return index;
}
constexpr std::array<uint8_t, 256> kIndex = BuildIndex();

// (transport, operation, position, suffix) -> index into kTable + 1 (0 = not defined), built at compile time: the
// reverse of kIndex, so a requester or responder choosing an opcode reads this table and no copy of it.
enum class Suffix : uint8_t { kNone, kImmediate, kInvalidate };
constexpr size_t kTransports = 6, kOperations = 10, kPositions = 4, kSuffixes = 3;
constexpr size_t MessageKey(T transport, O op, P position, Suffix suffix) {
  return ((static_cast<size_t>(transport) * kOperations + static_cast<size_t>(op)) * kPositions +
          static_cast<size_t>(position)) *
             kSuffixes +
         static_cast<size_t>(suffix);
}
constexpr Suffix SuffixOf(const OpcodeInfo& info) {
  return info.has_immediate ? Suffix::kImmediate : info.has_invalidate ? Suffix::kInvalidate : Suffix::kNone;
}
using MessageIndex = std::array<uint8_t, kTransports * kOperations * kPositions * kSuffixes>;
constexpr MessageIndex BuildMessageIndex() {
  MessageIndex index{};
  for (size_t i = 0; i < kTable.size(); ++i)
    index[MessageKey(kTable[i].transport, kTable[i].op, kTable[i].position, SuffixOf(kTable[i]))] =
        static_cast<uint8_t>(i + 1);
  return index;
}
constexpr MessageIndex kMessageIndex = BuildMessageIndex();
constexpr bool MessageKeysAreUnique() {
  size_t filled = 0;
  for (uint8_t i : kMessageIndex) filled += i != 0;
  return filled == kTable.size();
}
static_assert(MessageKeysAreUnique(), "two opcodes for one (transport, operation, position, suffix)");
static_assert(static_cast<size_t>(T::kXrc) + 1 == kTransports && static_cast<size_t>(O::kCnp) + 1 == kOperations);
static_assert(kTable.size() < 255);

constexpr bool TableIsSorted() {
  for (size_t i = 1; i < kTable.size(); ++i)
    if (kTable[i - 1].code >= kTable[i].code) return false;
  return true;
}
static_assert(TableIsSorted(), "AllOpcodes() promises ascending codes");

}  // namespace

std::string_view ToString(TransportKind kind) {
  switch (kind) {
    case T::kRc: return "RC";
    case T::kUc: return "UC";
    case T::kRd: return "RD";
    case T::kUd: return "UD";
    case T::kCnp: return "CNP";
    case T::kXrc: return "XRC";
  }
  return "?";
}

size_t ExtHeaderSize(ExtHeader header) {
  switch (header) {
    case kRdeth: return 4;
    case kDeth: return 8;
    case kXrcEth: return 4;
    case kReth: return 16;
    case kAtomicEth: return 28;
    case kAeth: return 4;
    case kAtomicAckEth: return 8;
    case kImmDt: return 4;
    case kIeth: return 4;
  }
  return 0;
}

size_t ExtHeadersLength(uint32_t headers) {
  // Every combination of the nine ExtHeader bits, summed once (a function's static: other files' initializers may
  // parse packets): this runs for each packet built and parsed, where the loop over the nine cost ~150 instructions
  // of a round trip's ~20,000 (callgrind).
  constexpr size_t kBits = std::size(kExtHeaderOrder);
  static const std::array<uint8_t, size_t{1} << kBits> lengths = [] {
    std::array<uint8_t, size_t{1} << kBits> sums{};
    for (uint32_t bits = 0; bits < sums.size(); ++bits) {
      size_t total = 0;
      for (ExtHeader h : kExtHeaderOrder)
        if (bits & h) total += ExtHeaderSize(h);
      sums[bits] = uint8_t(total);
    }
    return sums;
  }();
  return lengths[headers & ((1u << kBits) - 1)];
}

std::string_view ToString(ExtHeader header) {
  switch (header) {
    case kRdeth: return "RDETH";
    case kDeth: return "DETH";
    case kXrcEth: return "XRCETH";
    case kReth: return "RETH";
    case kAtomicEth: return "AtomicETH";
    case kAeth: return "AETH";
    case kAtomicAckEth: return "AtomicAckETH";
    case kImmDt: return "ImmDt";
    case kIeth: return "IETH";
  }
  return "?";
}

std::string_view ToString(MsgPosition position) {
  switch (position) {
    case P::kOnly: return "only";
    case P::kFirst: return "first";
    case P::kMiddle: return "middle";
    case P::kLast: return "last";
  }
  return "?";
}

std::string_view ToString(Operation op) {
  switch (op) {
    case O::kSend: return "SEND";
    case O::kRdmaWrite: return "RDMA_WRITE";
    case O::kReadRequest: return "RDMA_READ_REQUEST";
    case O::kReadResponse: return "RDMA_READ_RESPONSE";
    case O::kAcknowledge: return "ACKNOWLEDGE";
    case O::kAtomicAcknowledge: return "ATOMIC_ACKNOWLEDGE";
    case O::kCompareSwap: return "COMPARE_SWAP";
    case O::kFetchAdd: return "FETCH_ADD";
    case O::kResync: return "RESYNC";
    case O::kCnp: return "CNP";
  }
  return "?";
}

const OpcodeInfo* FindOpcode(uint8_t code) {
  uint8_t i = kIndex[code];
  return i == 0 ? nullptr : &kTable[i - 1];
}

std::span<const OpcodeInfo> AllOpcodes() { return kTable; }

MsgPosition PositionInMessage(uint64_t k, uint64_t packets) {
  const bool first = k == 0, last = k + 1 >= packets;
  return first && last ? P::kOnly : first ? P::kFirst : last ? P::kLast : P::kMiddle;
}

bool PayloadFitsPathMtu(MsgPosition position, size_t payload, uint32_t pmtu) {
  switch (position) {
    case P::kOnly: return payload <= pmtu;
    case P::kFirst:
    case P::kMiddle: return payload == pmtu;
    case P::kLast: return payload >= 1 && payload <= pmtu;
  }
  return false;
}

std::optional<uint8_t> MessageOpcode(TransportKind transport, Operation op, MsgPosition position, bool immediate,
                                     bool invalidate) {
  // ImmDt and IETH ride on a message's last packet only (IBTA 9.2: they follow the BTH of *_LAST and *_ONLY).
  const bool ends = position == P::kLast || position == P::kOnly;
  if (ends && immediate && invalidate) return std::nullopt;
  const Suffix suffix = !ends        ? Suffix::kNone
                        : immediate  ? Suffix::kImmediate
                        : invalidate ? Suffix::kInvalidate
                                     : Suffix::kNone;
  const uint8_t i = kMessageIndex[MessageKey(transport, op, position, suffix)];
  if (i == 0) return std::nullopt;
  return kTable[i - 1].code;
}

}  // namespace uroce::wire
