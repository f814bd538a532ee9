#include "wire/opcode.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace uroce::wire {
namespace {

TEST(Opcode, EveryDefinedCodeIsFoundAndReservedCodesAreNot) {
  // Defined per IBTA table 38 + A14 + A17: RC 0x00-0x14, 0x16-0x17; UC 0x20-0x2B; RD 0x40-0x55; UD 0x64-0x65;
  // CNP 0x81; XRC 0xA0-0xB4, 0xB6-0xB7.
  std::set<int> defined;
  for (int c = 0x00; c <= 0x17; ++c)
    if (c != 0x15) defined.insert(c);
  for (int c = 0x20; c <= 0x2B; ++c) defined.insert(c);
  for (int c = 0x40; c <= 0x55; ++c) defined.insert(c);
  defined.insert(0x64);
  defined.insert(0x65);
  defined.insert(0x81);
  for (int c = 0xA0; c <= 0xB7; ++c)
    if (c != 0xB5) defined.insert(c);

  for (int c = 0; c < 256; ++c) {
    const OpcodeInfo* info = FindOpcode(static_cast<uint8_t>(c));
    if (defined.count(c)) {
      ASSERT_NE(info, nullptr) << std::hex << c;
      EXPECT_EQ(info->code, c);
    } else {
      EXPECT_EQ(info, nullptr) << std::hex << c;
    }
  }
  EXPECT_EQ(AllOpcodes().size(), defined.size());
}

TEST(Opcode, TableIsConsistent) {
  std::set<std::string_view> names;
  int prev = -1;
  for (const OpcodeInfo& info : AllOpcodes()) {
    EXPECT_GT(info.code, prev);
    prev = info.code;
    EXPECT_TRUE(names.insert(info.name).second) << info.name;
    EXPECT_EQ(FindOpcode(info.code), &info);
    // The name starts with the transport.
    EXPECT_EQ(info.name.substr(0, ToString(info.transport).size()), ToString(info.transport)) << info.name;
    // Transport from the high 3 bits.
    static constexpr TransportKind kByHigh[] = {TransportKind::kRc, TransportKind::kUc,  TransportKind::kRd,
                                                TransportKind::kUd, TransportKind::kCnp, TransportKind::kXrc};
    EXPECT_EQ(info.transport, kByHigh[info.code >> 5]) << info.name;
    EXPECT_EQ(info.has_immediate, (info.headers & kImmDt) != 0);
    EXPECT_EQ(info.has_invalidate, (info.headers & kIeth) != 0);
    EXPECT_EQ(info.has_immediate, info.name.find("IMMEDIATE") != std::string_view::npos) << info.name;
    EXPECT_EQ(info.has_invalidate, info.name.find("INVALIDATE") != std::string_view::npos) << info.name;
    const bool first = info.name.find("_FIRST") != std::string_view::npos;
    const bool middle = info.name.find("_MIDDLE") != std::string_view::npos;
    const bool last = info.name.find("_LAST") != std::string_view::npos;
    EXPECT_EQ(info.position == MsgPosition::kFirst, first) << info.name;
    EXPECT_EQ(info.position == MsgPosition::kMiddle, middle) << info.name;
    EXPECT_EQ(info.position == MsgPosition::kLast, last) << info.name;
    // Only RD uses RDETH; XRCETH only on XRC requests; DETH on UD and RD requests.
    EXPECT_EQ((info.headers & kRdeth) != 0, info.transport == TransportKind::kRd) << info.name;
    EXPECT_EQ((info.headers & kXrcEth) != 0, info.transport == TransportKind::kXrc && info.is_request) << info.name;
    EXPECT_EQ((info.headers & kDeth) != 0,
              info.transport == TransportKind::kUd || (info.transport == TransportKind::kRd && info.is_request))
        << info.name;
    // A RETH exactly on the first/only packet of a write and on read requests.
    const bool wants_reth = (info.op == Operation::kRdmaWrite && (first || info.position == MsgPosition::kOnly)) ||
                            info.op == Operation::kReadRequest;
    EXPECT_EQ((info.headers & kReth) != 0, wants_reth) << info.name;
    // AETH on acknowledges and on read responses except the middle ones.
    const bool wants_aeth = info.op == Operation::kAcknowledge || info.op == Operation::kAtomicAcknowledge ||
                            (info.op == Operation::kReadResponse && !middle);
    EXPECT_EQ((info.headers & kAeth) != 0, wants_aeth) << info.name;
    EXPECT_EQ((info.headers & kAtomicEth) != 0,
              info.op == Operation::kCompareSwap || info.op == Operation::kFetchAdd)
        << info.name;
    EXPECT_EQ((info.headers & kAtomicAckEth) != 0, info.op == Operation::kAtomicAcknowledge) << info.name;
    // Payload on sends, writes, read responses and CNP.
    EXPECT_EQ(info.has_payload, info.op == Operation::kSend || info.op == Operation::kRdmaWrite ||
                                    info.op == Operation::kReadResponse || info.op == Operation::kCnp)
        << info.name;
  }
}

TEST(Opcode, SpecificEntries) {
  const OpcodeInfo* read_first = FindOpcode(0x0D);
  ASSERT_NE(read_first, nullptr);
  EXPECT_EQ(read_first->name, "RC_RDMA_READ_RESPONSE_FIRST");
  EXPECT_EQ(read_first->headers, kAeth);
  EXPECT_FALSE(read_first->is_request);

  const OpcodeInfo* xrc = FindOpcode(0xAB);
  ASSERT_NE(xrc, nullptr);
  EXPECT_EQ(xrc->name, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE");
  EXPECT_EQ(xrc->headers, kXrcEth | kReth | kImmDt);
  EXPECT_EQ(ExtHeadersLength(xrc->headers), 4u + 16u + 4u);

  const OpcodeInfo* xrc_last_imm = FindOpcode(0xA3);
  ASSERT_NE(xrc_last_imm, nullptr);
  EXPECT_EQ(xrc_last_imm->name, "XRC_SEND_LAST_WITH_IMMEDIATE");

  const OpcodeInfo* ud = FindOpcode(0x64);
  ASSERT_NE(ud, nullptr);
  EXPECT_EQ(ud->name, "UD_SEND_ONLY");
  EXPECT_EQ(ExtHeadersLength(ud->headers), 8u);

  const OpcodeInfo* atomic_ack = FindOpcode(0x12);
  ASSERT_NE(atomic_ack, nullptr);
  EXPECT_EQ(ExtHeadersLength(atomic_ack->headers), 12u);
  EXPECT_EQ(ExtHeadersLength(FindOpcode(0x13)->headers), 28u);
  EXPECT_EQ(ExtHeadersLength(FindOpcode(0x53)->headers), 4u + 8u + 28u);  // RD_COMPARE_SWAP

  const OpcodeInfo* cnp = FindOpcode(0x81);
  ASSERT_NE(cnp, nullptr);
  EXPECT_EQ(cnp->name, "CNP");
  EXPECT_EQ(cnp->fixed_payload, 16);
  EXPECT_EQ(cnp->headers, 0u);
}

TEST(Opcode, HeaderSizes) {
  EXPECT_EQ(ExtHeaderSize(kRdeth), 4u);
  EXPECT_EQ(ExtHeaderSize(kDeth), 8u);
  EXPECT_EQ(ExtHeaderSize(kXrcEth), 4u);
  EXPECT_EQ(ExtHeaderSize(kReth), 16u);
  EXPECT_EQ(ExtHeaderSize(kAtomicEth), 28u);
  EXPECT_EQ(ExtHeaderSize(kAeth), 4u);
  EXPECT_EQ(ExtHeaderSize(kAtomicAckEth), 8u);
  EXPECT_EQ(ExtHeaderSize(kImmDt), 4u);
  EXPECT_EQ(ExtHeaderSize(kIeth), 4u);
  EXPECT_EQ(ExtHeaderSize(static_cast<ExtHeader>(kReth | kAeth)), 0u);
  uint32_t all = 0;
  for (ExtHeader h : kExtHeaderOrder) all |= h;
  EXPECT_EQ(ExtHeadersLength(all), 80u);
  EXPECT_EQ(ExtHeadersLength(0), 0u);
  EXPECT_EQ(ToString(kAtomicAckEth), "AtomicAckETH");
  EXPECT_EQ(ToString(TransportKind::kXrc), "XRC");
  EXPECT_EQ(ToString(Operation::kReadResponse), "RDMA_READ_RESPONSE");
  EXPECT_EQ(ToString(MsgPosition::kMiddle), "middle");
}

TEST(Opcode, MessageOpcodeIsTheTableReadBackwards) {
  for (const OpcodeInfo& info : AllOpcodes()) {
    SCOPED_TRACE(std::string(info.name));
    EXPECT_EQ(MessageOpcode(info.transport, info.op, info.position, info.has_immediate, info.has_invalidate),
              info.code);
  }
}

TEST(Opcode, MessageOpcodeChoices) {
  using O = Operation;
  using P = MsgPosition;
  using T = TransportKind;
  EXPECT_EQ(MessageOpcode(T::kRc, O::kSend, P::kOnly, true, false), opcode::kRcSendOnlyWithImmediate);
  EXPECT_EQ(MessageOpcode(T::kRc, O::kSend, P::kLast, false, true), opcode::kRcSendLastWithInvalidate);
  // ImmDt and IETH belong to the last packet: asked for on a FIRST or MIDDLE packet, they are left off.
  EXPECT_EQ(MessageOpcode(T::kRc, O::kRdmaWrite, P::kFirst, true, false), opcode::kRcRdmaWriteFirst);
  EXPECT_EQ(MessageOpcode(T::kUc, O::kSend, P::kMiddle, false, true), opcode::kUcBase | opcode::kRcSendMiddle);
  EXPECT_EQ(MessageOpcode(T::kUc, O::kRdmaWrite, P::kLast, true, false), 0x29);  // UC_RDMA_WRITE_LAST_WITH_IMMEDIATE
  EXPECT_EQ(MessageOpcode(T::kUd, O::kSend, P::kOnly, true, false), opcode::kUdSendOnlyWithImmediate);
  EXPECT_EQ(MessageOpcode(T::kXrc, O::kReadResponse, P::kMiddle), 0xAE);
  // What a transport does not define.
  EXPECT_EQ(MessageOpcode(T::kUc, O::kReadRequest, P::kOnly), std::nullopt);
  EXPECT_EQ(MessageOpcode(T::kUd, O::kSend, P::kFirst), std::nullopt);
  EXPECT_EQ(MessageOpcode(T::kUc, O::kSend, P::kLast, false, true), std::nullopt);  // UC has no SEND with invalidate
  EXPECT_EQ(MessageOpcode(T::kRc, O::kRdmaWrite, P::kOnly, false, true), std::nullopt);
  EXPECT_EQ(MessageOpcode(T::kRc, O::kSend, P::kOnly, true, true), std::nullopt);
}

TEST(Opcode, PositionInMessage) {
  EXPECT_EQ(PositionInMessage(0, 1), MsgPosition::kOnly);
  EXPECT_EQ(PositionInMessage(0, 3), MsgPosition::kFirst);
  EXPECT_EQ(PositionInMessage(1, 3), MsgPosition::kMiddle);
  EXPECT_EQ(PositionInMessage(2, 3), MsgPosition::kLast);
}

}  // namespace
}  // namespace uroce::wire
