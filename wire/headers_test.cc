#include "wire/headers.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <random>

namespace uroce::wire {
namespace {

template <typename T>
std::array<uint8_t, T::kSize> Bytes(const T& h) {
  std::array<uint8_t, T::kSize> out{};
  h.Encode(out.data());
  return out;
}

TEST(Bth, KnownLayout) {
  Bth b;
  b.opcode = 0x0A;
  b.solicited = true;
  b.mig_req = false;
  b.pad_count = 3;
  b.transport_version = 0;
  b.pkey = 0x8001;
  b.fecn = false;
  b.becn = true;
  b.dest_qp = 0x123456;
  b.ack_req = true;
  b.psn = 0xABCDEF;
  const std::array<uint8_t, 12> want = {0x0A, 0xB0, 0x80, 0x01, 0x40, 0x12, 0x34, 0x56, 0x80, 0xAB, 0xCD, 0xEF};
  EXPECT_EQ(Bytes(b), want);
  EXPECT_EQ(Bth::Decode(want.data()), b);
}

TEST(Bth, MasksTwentyFourBitFields) {
  Bth b;
  b.dest_qp = 0xFF000001;
  b.psn = 0x01FFFFFF;
  Bth d = Bth::Decode(Bytes(b).data());
  EXPECT_EQ(d.dest_qp, 1u);
  EXPECT_EQ(d.psn, 0xFFFFFFu);
}

TEST(Bth, EveryByteStringRoundTrips) {
  // Decode -> Encode is the identity on any 12 bytes (reserved bits are kept).
  std::mt19937 rng(5);
  for (int i = 0; i < 2000; ++i) {
    std::array<uint8_t, 12> in;
    for (auto& x : in) x = static_cast<uint8_t>(rng());
    EXPECT_EQ(Bytes(Bth::Decode(in.data())), in);
  }
}

template <typename T>
void RandomRoundTrip(int seed) {
  std::mt19937 rng(seed);
  for (int i = 0; i < 500; ++i) {
    std::array<uint8_t, T::kSize> in;
    for (auto& x : in) x = static_cast<uint8_t>(rng());
    T h = T::Decode(in.data());
    EXPECT_EQ(Bytes(h), in);
    EXPECT_EQ(T::Decode(Bytes(h).data()), h);
  }
}

TEST(ExtHeaders, RandomRoundTrips) {
  RandomRoundTrip<Reth>(1);
  RandomRoundTrip<Aeth>(2);
  RandomRoundTrip<AtomicEth>(3);
  RandomRoundTrip<AtomicAckEth>(4);
  RandomRoundTrip<Deth>(5);
  RandomRoundTrip<ImmDt>(6);
  RandomRoundTrip<Ieth>(7);
  RandomRoundTrip<XrcEth>(8);
  RandomRoundTrip<Rdeth>(9);
}

TEST(ExtHeaders, KnownLayouts) {
  Reth reth{0x0102030405060708, 0x11223344, 0x00001000};
  EXPECT_EQ(Bytes(reth), (std::array<uint8_t, 16>{1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x22, 0x33, 0x44, 0, 0, 0x10, 0}));

  AtomicEth atomic{0x1000, 0xAABBCCDD, 0x0102030405060708, 0x1112131415161718};
  auto a = Bytes(atomic);
  EXPECT_EQ(a[7], 0x00);
  EXPECT_EQ(a[6], 0x10);
  EXPECT_EQ(a[8], 0xAA);
  EXPECT_EQ(a[12], 0x01);
  EXPECT_EQ(a[19], 0x08);
  EXPECT_EQ(a[20], 0x11);
  EXPECT_EQ(a[27], 0x18);

  Deth deth{0x80010000, 0, 0xABCDEF};
  EXPECT_EQ(Bytes(deth), (std::array<uint8_t, 8>{0x80, 0x01, 0, 0, 0, 0xAB, 0xCD, 0xEF}));
  Deth wide{1, 0, 0x7F000002};
  EXPECT_EQ(Deth::Decode(Bytes(wide).data()).src_qp, 2u);

  XrcEth xrc{0, 0x345678};
  EXPECT_EQ(Bytes(xrc), (std::array<uint8_t, 4>{0, 0x34, 0x56, 0x78}));
  Rdeth rdeth{0, 0xFF000042};
  EXPECT_EQ(Bytes(rdeth), (std::array<uint8_t, 4>{0, 0, 0, 0x42}));
  Ieth ieth{0xDEADBEEF};
  EXPECT_EQ(Bytes(ieth), (std::array<uint8_t, 4>{0xDE, 0xAD, 0xBE, 0xEF}));
  AtomicAckEth ack{0x0102030405060708};
  EXPECT_EQ(Bytes(ack), (std::array<uint8_t, 8>{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(ImmDt, HoldsWireBytesInNetworkOrder) {
  const uint8_t wire[4] = {0x12, 0x34, 0x56, 0x78};
  ImmDt imm = ImmDt::Decode(wire);
  uint32_t expect;
  std::memcpy(&expect, wire, 4);  // what ibv_wc::imm_data (__be32) holds for these wire bytes
  EXPECT_EQ(imm.imm, expect);
  EXPECT_EQ(Bytes(imm), (std::array<uint8_t, 4>{0x12, 0x34, 0x56, 0x78}));
}

TEST(Aeth, AckSyndrome) {
  Aeth a = Aeth::Ack(5, 0x1234567);
  EXPECT_EQ(a.syndrome, 0x05);
  EXPECT_EQ(a.msn, 0x234567u);
  EXPECT_EQ(a.kind(), AethKind::kAck);
  EXPECT_EQ(a.credit_count(), 5);
  EXPECT_EQ(a.ToString(), "ACK credits=5 msn=2311527");
  EXPECT_EQ(Aeth::Ack(kInvalidCredits, 1).ToString(), "ACK credits=invalid msn=1");
  EXPECT_EQ(Bytes(a), (std::array<uint8_t, 4>{0x05, 0x23, 0x45, 0x67}));
}

TEST(Aeth, RnrNakSyndrome) {
  Aeth a = Aeth::RnrNak(14, 3);
  EXPECT_EQ(a.syndrome, 0x2E);
  EXPECT_EQ(a.kind(), AethKind::kRnrNak);
  EXPECT_EQ(a.rnr_timer(), 14);
  EXPECT_EQ(a.ToString(), "RNR NAK timer=14 (1.28 ms) msn=3");
  EXPECT_EQ(Aeth::RnrNak(0, 0).ToString(), "RNR NAK timer=0 (655.36 ms) msn=0");
}

TEST(Aeth, NakSyndromes) {
  const std::pair<NakCode, uint8_t> cases[] = {
      {NakCode::kPsnSeqError, 0x60},           {NakCode::kInvalidRequest, 0x61},
      {NakCode::kRemoteAccessError, 0x62},     {NakCode::kRemoteOperationalError, 0x63},
      {NakCode::kInvalidRdRequest, 0x64},
  };
  for (auto [code, syndrome] : cases) {
    Aeth a = Aeth::Nak(code, 9);
    EXPECT_EQ(a.syndrome, syndrome);
    EXPECT_EQ(a.kind(), AethKind::kNak);
    EXPECT_EQ(a.nak_code(), code);
    EXPECT_EQ(Aeth::Decode(Bytes(a).data()), a);
  }
  EXPECT_EQ(Aeth::Nak(NakCode::kRemoteAccessError, 9).ToString(), "NAK remote access error (code 2) msn=9");
  Aeth reserved_code{0x6A, 1};
  EXPECT_EQ(reserved_code.ToString(), "NAK reserved (code 10) msn=1");
}

TEST(Aeth, ReservedKind) {
  Aeth a{0x45, 0};
  EXPECT_EQ(a.kind(), AethKind::kReserved);
  EXPECT_EQ(a.ToString(), "reserved syndrome 0x45 msn=0");
  // Bit 7 is reserved and does not change the kind.
  EXPECT_EQ((Aeth{0x85, 0}.kind()), AethKind::kAck);
  EXPECT_EQ((Aeth{0xE1, 0}.kind()), AethKind::kNak);
}

TEST(Aeth, RnrTimerTable) {
  // IBTA Vol 1 table 45, in milliseconds: code 1..31, then code 0.
  const double ms[32] = {655.36, 0.01,  0.02,  0.03,  0.04,  0.06,  0.08,   0.12,   0.16,   0.24,   0.32,
                         0.48,   0.64,  0.96,  1.28,  1.92,  2.56,  3.84,   5.12,   7.68,   10.24,  15.36,
                         20.48,  30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52};
  for (int code = 0; code < 32; ++code)
    EXPECT_EQ(RnrTimerMicros(static_cast<uint8_t>(code)), static_cast<uint32_t>(ms[code] * 1000 + 0.5)) << code;
  EXPECT_EQ(RnrTimerMicros(32 + 14), RnrTimerMicros(14));
  // Monotonic from code 1 up.
  for (int code = 2; code < 32; ++code)
    EXPECT_GT(RnrTimerMicros(static_cast<uint8_t>(code)), RnrTimerMicros(static_cast<uint8_t>(code - 1)));
}

}  // namespace
}  // namespace uroce::wire
