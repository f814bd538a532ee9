#include "wire/packet.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "wire/bytes.h"
#include "wire/expected.h"

namespace uroce::wire {
namespace {

// A spec with every extension header filled in with distinctive values; EncodePacket uses those the opcode needs.
PacketSpec FullSpec(uint8_t opcode, std::mt19937& rng) {
  PacketSpec s;
  s.bth.opcode = opcode;
  s.bth.solicited = rng() & 1;
  s.bth.mig_req = rng() & 1;
  s.bth.pkey = static_cast<uint16_t>(rng());
  s.bth.fecn = rng() & 1;
  s.bth.becn = rng() & 1;
  s.bth.dest_qp = rng() & kMask24;
  s.bth.ack_req = rng() & 1;
  s.bth.psn = rng() & kMask24;
  s.rdeth = Rdeth{0, static_cast<uint32_t>(rng() & kMask24)};
  s.deth = Deth{static_cast<uint32_t>(rng()), 0, static_cast<uint32_t>(rng() & kMask24)};
  s.xrc = XrcEth{0, static_cast<uint32_t>(rng() & kMask24)};
  s.reth = Reth{(uint64_t{rng()} << 32) | rng(), static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng())};
  s.atomic = AtomicEth{uint64_t{rng()} << 3, static_cast<uint32_t>(rng()), (uint64_t{rng()} << 32) | rng(),
                       (uint64_t{rng()} << 32) | rng()};
  s.aeth = Aeth::Ack(static_cast<uint8_t>(rng() & 31), static_cast<uint32_t>(rng()));
  s.atomic_ack = AtomicAckEth{(uint64_t{rng()} << 32) | rng()};
  s.imm = ImmDt{static_cast<uint32_t>(rng())};
  s.ieth = Ieth{static_cast<uint32_t>(rng())};
  return s;
}

std::vector<uint8_t> PayloadFor(const OpcodeInfo& info, size_t len, std::mt19937& rng) {
  if (!info.has_payload) return {};
  if (info.fixed_payload) len = info.fixed_payload;
  std::vector<uint8_t> p(len);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  if (info.op == Operation::kCnp) std::fill(p.begin(), p.end(), 0);
  return p;
}

std::vector<uint8_t> Encode(const PacketSpec& spec, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out(EncodedLength(spec, payload.size()));
  auto n = EncodePacket(spec, payload, out);
  EXPECT_TRUE(n.has_value()) << ToString(n.error());
  EXPECT_EQ(*n, out.size());
  return out;
}

TEST(Packet, RoundTripEveryOpcode) {
  std::mt19937 rng(11);
  for (const OpcodeInfo& info : AllOpcodes()) {
    for (size_t len : {0, 1, 2, 3, 4, 5, 1024, 4097}) {
      SCOPED_TRACE(info.name);
      SCOPED_TRACE(len);
      PacketSpec spec = FullSpec(info.code, rng);
      auto payload = PayloadFor(info, len, rng);
      auto bytes = Encode(spec, payload);
      EXPECT_EQ(bytes.size(), Bth::kSize + ExtHeadersLength(info.headers) + payload.size() +
                                  PadFor(payload.size()) + kIcrcSize);
      EXPECT_EQ(bytes.size() % 4, 0u);
      // Zero pad and ICRC placeholder.
      for (size_t i = bytes.size() - kIcrcSize - PadFor(payload.size()); i < bytes.size(); ++i)
        EXPECT_EQ(bytes[i], 0);

      auto view = ParsePacket(bytes);
      ASSERT_TRUE(view.has_value()) << ToString(view.error());
      EXPECT_EQ(view->info, &info);
      Bth want_bth = spec.bth;
      want_bth.pad_count = PadFor(payload.size());
      EXPECT_EQ(view->bth, want_bth);
      EXPECT_EQ(std::vector<uint8_t>(view->payload.begin(), view->payload.end()), payload);
      EXPECT_EQ(view->pad.size(), PadFor(payload.size()));
      EXPECT_EQ(view->icrc, 0u);
      EXPECT_EQ(view->bytes.data(), bytes.data());
      EXPECT_EQ(view->bytes.size(), bytes.size());
      auto check = [&](ExtHeader h, const auto& got, const auto& want) {
        if (info.headers & h) {
          ASSERT_TRUE(got.has_value()) << ToString(h);
          EXPECT_EQ(*got, *want) << ToString(h);
        } else {
          EXPECT_FALSE(got.has_value()) << ToString(h);
        }
      };
      check(kRdeth, view->rdeth, spec.rdeth);
      check(kDeth, view->deth, spec.deth);
      check(kXrcEth, view->xrc, spec.xrc);
      check(kReth, view->reth, spec.reth);
      check(kAtomicEth, view->atomic, spec.atomic);
      check(kAeth, view->aeth, spec.aeth);
      check(kAtomicAckEth, view->atomic_ack, spec.atomic_ack);
      check(kImmDt, view->imm, spec.imm);
      check(kIeth, view->ieth, spec.ieth);

      // Re-encoding the parsed view reproduces the bytes.
      EXPECT_EQ(Encode(SpecFromView(*view), payload), bytes);
      if (!info.has_payload) break;
    }
  }
}

TEST(Packet, HeaderOrderOnTheWire) {
  // XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: BTH, XRCETH, RETH, ImmDt (Annex A14).
  PacketSpec s;
  s.bth.opcode = 0xAB;
  s.xrc = XrcEth{0, 0x0A0B0C};
  s.reth = Reth{0x1111111111111111, 0x22222222, 0x33333333};
  s.imm = ImmDt::Decode(std::array<uint8_t, 4>{0x44, 0x44, 0x44, 0x44}.data());
  const std::vector<uint8_t> payload = {0x55};
  auto bytes = Encode(s, payload);
  ASSERT_EQ(bytes.size(), 12u + 4 + 16 + 4 + 1 + 3 + 4);
  EXPECT_EQ(LoadBe24(bytes.data() + 13), 0x0A0B0Cu);
  EXPECT_EQ(bytes[16], 0x11);
  EXPECT_EQ(bytes[32], 0x44);
  EXPECT_EQ(bytes[36], 0x55);
  EXPECT_EQ((bytes[1] >> 4) & 3, 3);  // pad count

  // RD_SEND_ONLY: BTH, RDETH, DETH.
  PacketSpec rd;
  rd.bth.opcode = 0x44;
  rd.rdeth = Rdeth{0, 0xEEEEEE};
  rd.deth = Deth{0xDDDDDDDD, 0, 0x0C0C0C};
  auto rd_bytes = Encode(rd, {});
  EXPECT_EQ(LoadBe24(rd_bytes.data() + 13), 0xEEEEEEu);
  EXPECT_EQ(LoadBe32(rd_bytes.data() + 16), 0xDDDDDDDDu);

  // RC_ATOMIC_ACKNOWLEDGE: BTH, AETH, AtomicAckETH.
  PacketSpec ack;
  ack.bth.opcode = 0x12;
  ack.aeth = Aeth::Ack(31, 7);
  ack.atomic_ack = AtomicAckEth{0x0102030405060708};
  auto ack_bytes = Encode(ack, {});
  EXPECT_EQ(ack_bytes[12], 0x1F);
  EXPECT_EQ(LoadBe64(ack_bytes.data() + 16), 0x0102030405060708u);
}

TEST(Packet, EncodeErrors) {
  std::vector<uint8_t> big(64);
  PacketSpec s;
  s.bth.opcode = 0x15;
  EXPECT_EQ(EncodePacket(s, {}, big).error(), EncodeError::kUnknownOpcode);
  s.bth.opcode = 0x0A;  // RC_RDMA_WRITE_ONLY needs RETH
  EXPECT_EQ(EncodePacket(s, {}, big).error(), EncodeError::kMissingHeader);
  s.reth = Reth{};
  EXPECT_TRUE(EncodePacket(s, {}, big).has_value());
  std::vector<uint8_t> small(EncodedLength(s, 8) - 1);
  std::vector<uint8_t> eight(8, 1);
  EXPECT_EQ(EncodePacket(s, eight, small).error(), EncodeError::kBufferTooSmall);
  s.bth.opcode = 0x11;  // RC_ACKNOWLEDGE: no payload
  s.aeth = Aeth::Ack(0, 0);
  EXPECT_EQ(EncodePacket(s, eight, big).error(), EncodeError::kPayloadUnexpected);
  s.bth.opcode = 0x81;  // CNP: exactly 16 bytes
  EXPECT_EQ(EncodePacket(s, eight, big).error(), EncodeError::kBadPayloadLength);
  std::vector<uint8_t> sixteen(16);
  EXPECT_EQ(*EncodePacket(s, sixteen, big), 32u);
}

TEST(Packet, GatheredPayloadEncodesAsTheSameBytesInOnePiece) {
  PacketSpec s;
  s.bth.opcode = 0x0A;  // RC_RDMA_WRITE_ONLY
  s.bth.psn = 77;
  s.reth = Reth{0x1000, 0x42, 11};
  const std::vector<uint8_t> all = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const std::span<const uint8_t> v(all);
  const std::span<const uint8_t> pieces[] = {v.subspan(0, 3), v.subspan(3, 0), v.subspan(3, 7), v.subspan(10)};
  std::vector<uint8_t> one(EncodedLength(s, all.size())), gathered(one.size());
  ASSERT_EQ(*EncodePacket(s, all, one), one.size());
  ASSERT_EQ(*EncodePacketGathered(s, pieces, gathered), one.size());
  EXPECT_EQ(gathered, one);  // pad computed from the total, not from the last piece
  std::vector<uint8_t> small(one.size() - 1);
  EXPECT_EQ(EncodePacketGathered(s, pieces, small).error(), EncodeError::kBufferTooSmall);
}

TEST(Packet, EncodeIgnoresPadCountAndVersionInSpec) {
  PacketSpec s;
  s.bth.opcode = 0x04;
  s.bth.pad_count = 2;
  s.bth.transport_version = 5;
  auto bytes = Encode(s, {1, 2, 3, 4});
  EXPECT_EQ(bytes[1], 0x00);
}

TEST(Packet, ParseErrors) {
  auto expect_error = [](std::vector<uint8_t> bytes, ParseError want) {
    auto r = ParsePacket(bytes);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error(), want) << ToString(r.error());
  };
  std::vector<uint8_t> ack(20, 0);
  ack[0] = 0x11;
  EXPECT_TRUE(ParsePacket(ack).has_value());

  expect_error({}, ParseError::kTruncated);
  expect_error(std::vector<uint8_t>(15, 0), ParseError::kTruncated);
  auto unknown = ack;
  unknown[0] = 0x15;
  expect_error(unknown, ParseError::kUnknownOpcode);
  unknown[0] = 0xC0;
  expect_error(unknown, ParseError::kUnknownOpcode);
  auto version = ack;
  version[1] = 0x01;
  expect_error(version, ParseError::kBadTransportVersion);
  auto short_ack = ack;
  short_ack.resize(19);
  expect_error(short_ack, ParseError::kTruncated);
  auto long_ack = ack;
  long_ack.resize(24);
  expect_error(long_ack, ParseError::kPayloadUnexpected);
  auto padded_ack = ack;
  padded_ack[1] = 0x10;
  expect_error(padded_ack, ParseError::kPadTooLong);

  std::vector<uint8_t> send(16, 0);  // RC_SEND_ONLY with an empty payload
  send[0] = 0x04;
  EXPECT_TRUE(ParsePacket(send).has_value());
  auto send_pad = send;
  send_pad[1] = 0x30;  // pad 3 but no bytes for it
  expect_error(send_pad, ParseError::kPadTooLong);
  auto odd = send;
  odd.push_back(0);  // 1 byte of payload, no pad: not 4-aligned
  expect_error(odd, ParseError::kMisaligned);
  auto four = send;
  four.insert(four.begin() + 12, {9, 9, 9, 9});
  four[1] = 0x30;  // 4 body bytes, pad 3 -> 1 byte of payload
  auto v = ParsePacket(four);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->payload.size(), 1u);
  EXPECT_EQ(v->pad.size(), 3u);

  std::vector<uint8_t> cnp(32, 0);
  cnp[0] = 0x81;
  EXPECT_TRUE(ParsePacket(cnp).has_value());
  cnp.resize(28);
  expect_error(cnp, ParseError::kBadPayloadLength);
}

TEST(Packet, IcrcReadLittleEndian) {
  std::vector<uint8_t> ack(20, 0);
  ack[0] = 0x11;
  ack[16] = 0x78;
  ack[17] = 0x56;
  ack[18] = 0x34;
  ack[19] = 0x12;
  EXPECT_EQ(ParsePacket(ack)->icrc, 0x12345678u);
}

TEST(Packet, EveryPrefixOfValidPacketsFailsCleanly) {
  // Under ASan this proves no read past the end: each prefix is copied into its own exact-size buffer.
  std::mt19937 rng(12);
  for (const OpcodeInfo& info : AllOpcodes()) {
    PacketSpec spec = FullSpec(info.code, rng);
    auto payload = PayloadFor(info, 37, rng);
    auto bytes = Encode(spec, payload);
    for (size_t n = 0; n < bytes.size(); ++n) {
      std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + n);
      auto r = ParsePacket(prefix);
      // A prefix may only parse if it is itself a well-formed packet (a shorter payload), never with the full
      // payload, and must otherwise report an error.
      if (r.has_value()) {
        EXPECT_TRUE(info.has_payload && info.fixed_payload == 0) << info.name << " prefix " << n;
        EXPECT_LE(r->payload.size() + r->pad.size() + ExtHeadersLength(info.headers) + 16, n);
      }
    }
    EXPECT_TRUE(ParsePacket(bytes).has_value());
  }
}

TEST(Packet, RandomBytesNeverCrash) {
  std::mt19937 rng(13);
  int parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> junk(rng() % 96);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    if (!junk.empty() && (i & 1)) junk[0] = AllOpcodes()[rng() % AllOpcodes().size()].code;
    if (junk.size() > 1 && (i & 2)) junk[1] &= 0xF0;
    auto r = ParsePacket(junk);
    if (r.has_value()) {
      ++parsed;
      EXPECT_LE(r->payload.data() + r->payload.size() + r->pad.size() + kIcrcSize, junk.data() + junk.size());
      // Whatever parses re-encodes to the same header and payload bytes.
      std::vector<uint8_t> payload(r->payload.begin(), r->payload.end());
      PacketSpec spec = SpecFromView(*r);
      std::vector<uint8_t> out(EncodedLength(spec, payload.size()));
      ASSERT_TRUE(EncodePacket(spec, payload, out).has_value());
      ASSERT_EQ(out.size(), junk.size());
      const size_t covered = junk.size() - kIcrcSize - r->pad.size();
      EXPECT_TRUE(std::equal(out.begin(), out.begin() + covered, junk.begin()));
    }
  }
  EXPECT_GT(parsed, 100);  // the generator does reach the successful paths
}

TEST(Expected, Basics) {
  Expected<int, ParseError> good = 5;
  EXPECT_TRUE(good.has_value());
  EXPECT_TRUE(static_cast<bool>(good));
  EXPECT_EQ(*good, 5);
  EXPECT_EQ(good.value(), 5);
  Expected<int, ParseError> bad = Unexpected(ParseError::kTruncated);
  EXPECT_FALSE(bad);
  EXPECT_EQ(bad.error(), ParseError::kTruncated);
  EXPECT_EQ(bad.value_or(7), 7);
  struct S {
    int x;
  };
  Expected<S, EncodeError> s = S{3};
  EXPECT_EQ(s->x, 3);
}

}  // namespace
}  // namespace uroce::wire
