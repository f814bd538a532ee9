#include "wire/icrc.h"

#include <immintrin.h>

#include <array>
#include <cstring>

#include "wire/bytes.h"
#include "wire/clock.h"
#include "wire/frame.h"
#include "wire/headers.h"
#include "wire/packet.h"

namespace uroce::wire {
namespace {

// ---- Slicing-by-8 (portable) -------------------------------------------------------------------------------------
// Table k maps a byte to the CRC contribution of that byte followed by k zero bytes, so eight table look-ups advance
// the CRC by eight bytes at once.
constexpr uint32_t kPoly = 0xEDB88320;  // IEEE 802.3 polynomial, bit-reversed

using Tables = std::array<std::array<uint32_t, 256>, 8>;
constexpr Tables BuildTables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
  return t;
}
constexpr Tables kTables = BuildTables();

// All "Raw" functions work on the CRC register itself (no initial/final inversion).
uint32_t RawSliceBy8(uint32_t crc, const uint8_t* p, size_t len) {
  while (len >= 8) {
    const uint32_t lo = LoadLe32(p) ^ crc;
    const uint32_t hi = LoadLe32(p + 4);
    crc = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^ kTables[5][(lo >> 16) & 0xFF] ^
          kTables[4][lo >> 24] ^ kTables[3][hi & 0xFF] ^ kTables[2][(hi >> 8) & 0xFF] ^
          kTables[1][(hi >> 16) & 0xFF] ^ kTables[0][hi >> 24];
    p += 8;
    len -= 8;
  }
  while (len-- > 0) crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xFF];
  return crc;
}

// ---- Carry-less multiplication folding ---------------------------------------------------------------------------
// The method of Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction" (Intel,
// 2009): keep four 128-bit lanes of the message, fold each forward by 512 bits with two carry-less multiplications
// by powers of x modulo P, then fold the lanes into one, reduce 128 -> 64 -> 32 bits and
// finish with a Barrett reduction. The constants are powers of x modulo the CRC-32 polynomial, bit-reflected and
// shifted left by one as the reflected domain requires.
// Pairs of constants fold a 128-bit lane forward by 512 bits (four lanes) or by 128 bits (one lane); each half of
// the lane is multiplied by its own power of x.
constexpr uint64_t kFold512Lo = 0x154442BD4;
constexpr uint64_t kFold512Hi = 0x1C6E41596;
constexpr uint64_t kFold128Lo = 0x1751997D0;
constexpr uint64_t kFold128Hi = 0x0CCAA009E;
constexpr uint64_t kFold64 = 0x163CD6124;  // reduces 96 bits to 64
constexpr uint64_t kPolyReflected = 0x1DB710641;  // P(x), reflected, 33 bits
constexpr uint64_t kBarrettMu = 0x1F7011641;      // floor(x^64 / P(x)), reflected

#define UROCE_CLMUL __attribute__((target("pclmul,sse4.1")))

UROCE_CLMUL inline __m128i Fold(__m128i acc, __m128i k, __m128i next) {
  const __m128i lo = _mm_clmulepi64_si128(acc, k, 0x00);
  const __m128i hi = _mm_clmulepi64_si128(acc, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

UROCE_CLMUL inline __m128i Load(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// 128 -> 32 bits: the remainder of the folded lane, as the CRC register.
UROCE_CLMUL inline uint32_t Reduce128(__m128i x1) {
  const __m128i k128 = _mm_set_epi64x(static_cast<long long>(kFold128Hi), static_cast<long long>(kFold128Lo));
  // 128 -> 64 bits: multiply the low half by the 128-bit fold constant and add the high half.
  const __m128i mask32 = _mm_setr_epi32(-1, 0, -1, 0);
  __m128i t = _mm_clmulepi64_si128(x1, k128, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), t);
  // 64 -> 32+32 bits: multiply the low 32 bits by x^64 and add the rest.
  const __m128i k64 = _mm_set_epi64x(0, static_cast<long long>(kFold64));
  t = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k64, 0x00), t);
  // Barrett reduction to the 32-bit remainder.
  const __m128i barrett = _mm_set_epi64x(static_cast<long long>(kBarrettMu), static_cast<long long>(kPolyReflected));
  t = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), barrett, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), barrett, 0x00);
  x1 = _mm_xor_si128(x1, t);
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

// Folds the remaining whole 16-byte blocks into x1 and reduces. Precondition: len % 16 == 0.
UROCE_CLMUL inline uint32_t FoldTailAndReduce(__m128i x1, const uint8_t* p, size_t len) {
  const __m128i k128 = _mm_set_epi64x(static_cast<long long>(kFold128Hi), static_cast<long long>(kFold128Lo));
  while (len >= 16) {
    x1 = Fold(x1, k128, Load(p));
    p += 16;
    len -= 16;
  }
  return Reduce128(x1);
}

// Precondition: len >= 64 and len % 16 == 0.
UROCE_CLMUL uint32_t RawClmulBlocks(uint32_t crc, const uint8_t* p, size_t len) {
  __m128i x1 = _mm_xor_si128(Load(p), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x2 = Load(p + 16);
  __m128i x3 = Load(p + 32);
  __m128i x4 = Load(p + 48);
  p += 64;
  len -= 64;

  const __m128i k512 = _mm_set_epi64x(static_cast<long long>(kFold512Hi), static_cast<long long>(kFold512Lo));
  while (len >= 64) {
    x1 = Fold(x1, k512, Load(p));
    x2 = Fold(x2, k512, Load(p + 16));
    x3 = Fold(x3, k512, Load(p + 32));
    x4 = Fold(x4, k512, Load(p + 48));
    p += 64;
    len -= 64;
  }

  const __m128i k128 = _mm_set_epi64x(static_cast<long long>(kFold128Hi), static_cast<long long>(kFold128Lo));
  x1 = Fold(x1, k128, x2);
  x1 = Fold(x1, k128, x3);
  x1 = Fold(x1, k128, x4);
  return FoldTailAndReduce(x1, p, len);
}

// ---- The same folding on 512-bit registers (VPCLMULQDQ, AVX-512) -------------------------------------------------
// Sixteen 128-bit lanes in four registers, each folded forward by 2048 bits per step; then the registers into one
// (512-bit folds), its four lanes into one (folds by 384, 256 and 128 bits), and the 128-bit tail as above.
// Constants: reflect32(x^(D+32) mod P) << 1 and reflect32(x^(D-32) mod P) << 1 for a fold distance of D bits.
constexpr uint64_t kFold2048Lo = 0x11542778A;
constexpr uint64_t kFold2048Hi = 0x1322D1430;
constexpr uint64_t kFold384Lo = 0x03DB1ECDC;
constexpr uint64_t kFold384Hi = 0x174359406;
constexpr uint64_t kFold256Lo = 0x0F1DA05AA;
constexpr uint64_t kFold256Hi = 0x15A546366;

#define UROCE_VPCLMUL __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.1")))

UROCE_VPCLMUL inline __m512i Fold512(__m512i acc, __m512i k, __m512i next) {
  const __m512i lo = _mm512_clmulepi64_epi128(acc, k, 0x00);
  const __m512i hi = _mm512_clmulepi64_epi128(acc, k, 0x11);
  return _mm512_ternarylogic_epi64(lo, hi, next, 0x96);  // lo ^ hi ^ next
}
UROCE_VPCLMUL inline __m512i Load512(const uint8_t* p) { return _mm512_loadu_si512(p); }
UROCE_VPCLMUL inline __m512i Broadcast(uint64_t hi, uint64_t lo) {
  return _mm512_set4_epi64(static_cast<long long>(hi), static_cast<long long>(lo), static_cast<long long>(hi),
                           static_cast<long long>(lo));
}

// Precondition: len >= 256 and len % 16 == 0.
UROCE_VPCLMUL uint32_t RawVpclmulBlocks(uint32_t crc, const uint8_t* p, size_t len) {
  const __m512i seed = _mm512_inserti32x4(_mm512_setzero_si512(), _mm_cvtsi32_si128(static_cast<int>(crc)), 0);
  __m512i z0 = _mm512_xor_si512(Load512(p), seed);
  __m512i z1 = Load512(p + 64);
  __m512i z2 = Load512(p + 128);
  __m512i z3 = Load512(p + 192);
  p += 256;
  len -= 256;

  const __m512i k2048 = Broadcast(kFold2048Hi, kFold2048Lo);
  while (len >= 256) {
    z0 = Fold512(z0, k2048, Load512(p));
    z1 = Fold512(z1, k2048, Load512(p + 64));
    z2 = Fold512(z2, k2048, Load512(p + 128));
    z3 = Fold512(z3, k2048, Load512(p + 192));
    p += 256;
    len -= 256;
  }

  const __m512i k512 = Broadcast(kFold512Hi, kFold512Lo);
  z0 = Fold512(z0, k512, z1);
  z0 = Fold512(z0, k512, z2);
  z0 = Fold512(z0, k512, z3);
  while (len >= 64) {
    z0 = Fold512(z0, k512, Load512(p));
    p += 64;
    len -= 64;
  }

  // Lanes 0, 1, 2 are 384, 256 and 128 bits ahead of lane 3; fold them onto it. Lane 3's constants are 0.
  using ll = long long;
  const __m512i k_lanes = _mm512_set_epi64(0, 0, static_cast<ll>(kFold128Hi), static_cast<ll>(kFold128Lo),
                                           static_cast<ll>(kFold256Hi), static_cast<ll>(kFold256Lo),
                                           static_cast<ll>(kFold384Hi), static_cast<ll>(kFold384Lo));
  const __m512i folded = _mm512_xor_si512(_mm512_clmulepi64_epi128(z0, k_lanes, 0x00),
                                          _mm512_clmulepi64_epi128(z0, k_lanes, 0x11));
  // (The zero-masking form of the lane extraction avoids a GCC 12 -Wuninitialized false positive.)
  __m128i x = _mm512_maskz_extracti32x4_epi32(0xF, z0, 3);
  x = _mm_xor_si128(x, _mm512_maskz_extracti32x4_epi32(0xF, folded, 0));
  x = _mm_xor_si128(x, _mm512_maskz_extracti32x4_epi32(0xF, folded, 1));
  x = _mm_xor_si128(x, _mm512_maskz_extracti32x4_epi32(0xF, folded, 2));
  return FoldTailAndReduce(x, p, len);
}

// ---- The same folding on 256-bit registers (VPCLMULQDQ, AVX2) ---------------------------------------------------
// For CPUs with VPCLMULQDQ but without AVX-512 (AMD Zen 3, Intel's E-cores): eight 128-bit lanes in four registers,
// each folded forward by 1024 bits per step, then the registers into one (256-bit folds) and its two lanes into one
// (a 128-bit fold). Each carry-less multiplication does two lanes' work, so the folding loop does half the
// instructions of the 128-bit one per byte.
constexpr uint64_t kFold1024Lo = 0x1E88EF372;
constexpr uint64_t kFold1024Hi = 0x14A7FE880;

#define UROCE_VPCLMUL256 __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.1")))

UROCE_VPCLMUL256 inline __m256i Fold256(__m256i acc, __m256i k, __m256i next) {
  const __m256i lo = _mm256_clmulepi64_epi128(acc, k, 0x00);
  const __m256i hi = _mm256_clmulepi64_epi128(acc, k, 0x11);
  return _mm256_xor_si256(_mm256_xor_si256(lo, hi), next);
}
UROCE_VPCLMUL256 inline __m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
UROCE_VPCLMUL256 inline __m256i Broadcast256(uint64_t hi, uint64_t lo) {
  return _mm256_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo), static_cast<long long>(hi),
                           static_cast<long long>(lo));
}

// Precondition: len >= 128 and len % 16 == 0.
UROCE_VPCLMUL256 uint32_t RawVpclmul256Blocks(uint32_t crc, const uint8_t* p, size_t len) {
  const __m256i seed = _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_cvtsi32_si128(static_cast<int>(crc)), 0);
  __m256i y0 = _mm256_xor_si256(Load256(p), seed);
  __m256i y1 = Load256(p + 32);
  __m256i y2 = Load256(p + 64);
  __m256i y3 = Load256(p + 96);
  p += 128;
  len -= 128;

  const __m256i k1024 = Broadcast256(kFold1024Hi, kFold1024Lo);
  while (len >= 128) {
    y0 = Fold256(y0, k1024, Load256(p));
    y1 = Fold256(y1, k1024, Load256(p + 32));
    y2 = Fold256(y2, k1024, Load256(p + 64));
    y3 = Fold256(y3, k1024, Load256(p + 96));
    p += 128;
    len -= 128;
  }

  const __m256i k256 = Broadcast256(kFold256Hi, kFold256Lo);
  y0 = Fold256(y0, k256, y1);
  y0 = Fold256(y0, k256, y2);
  y0 = Fold256(y0, k256, y3);
  while (len >= 32) {
    y0 = Fold256(y0, k256, Load256(p));
    p += 32;
    len -= 32;
  }

  // The low lane is 128 bits ahead of the high one.
  const __m128i k128 = _mm_set_epi64x(static_cast<long long>(kFold128Hi), static_cast<long long>(kFold128Lo));
  const __m128i x = Fold(_mm256_castsi256_si128(y0), k128, _mm256_extracti128_si256(y0, 1));
  return FoldTailAndReduce(x, p, len);
}

const bool kHaveClmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
const bool kHaveVpclmul = kHaveClmul && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq");
const bool kHaveVpclmul256 = kHaveClmul && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq");

// Precondition: 16 <= len < 64 and len % 16 == 0: one lane, folded forward a block at a time.
UROCE_CLMUL uint32_t RawClmulShortBlocks(uint32_t crc, const uint8_t* p, size_t len) {
  const __m128i x1 = _mm_xor_si128(Load(p), _mm_cvtsi32_si128(static_cast<int>(crc)));
  return FoldTailAndReduce(x1, p + 16, len - 16);
}

// Short inputs fold too: a packet's masked pseudo-header (48 bytes for IPv4) is CRCed once per packet sent or
// received, between system calls that may have evicted slice-by-8's 8 KiB of tables from the L1 cache; folding
// touches no table (ib_send_lat 2 B, typical half round trip: 5.62 -> 5.52 us).
uint32_t RawClmul(uint32_t crc, const uint8_t* p, size_t len) {
  if (len >= 16) {
    const size_t blocks = len & ~size_t{15};
    crc = blocks >= 64 ? RawClmulBlocks(crc, p, blocks) : RawClmulShortBlocks(crc, p, blocks);
    p += blocks;
    len -= blocks;
  }
  return RawSliceBy8(crc, p, len);
}

// Folding on wide registers: `Blocks` takes the whole 16-byte blocks of an input of at least `kMinLen` bytes,
// slicing-by-8 the rest; a shorter input folds on 128-bit registers.
template <size_t kMinLen, uint32_t (*Blocks)(uint32_t, const uint8_t*, size_t)>
uint32_t RawWideFolding(uint32_t crc, const uint8_t* p, size_t len) {
  if (len < kMinLen) return RawClmul(crc, p, len);
  const size_t blocks = len & ~size_t{15};
  crc = Blocks(crc, p, blocks);
  return RawSliceBy8(crc, p + blocks, len - blocks);
}
constexpr auto RawVpclmul = RawWideFolding<256, RawVpclmulBlocks>;
constexpr auto RawVpclmul256 = RawWideFolding<128, RawVpclmul256Blocks>;

uint32_t RawFolding(uint32_t crc, const uint8_t* p, size_t len) {
  if (kHaveVpclmul) return RawVpclmul(crc, p, len);
  if (kHaveVpclmul256) return RawVpclmul256(crc, p, len);
  return RawClmul(crc, p, len);
}

// Folding with carry-less multiplication is the fastest on every CPU that has it (ICRC of 4 KiB: ~20 GB/s against
// slice-by-8's ~1.5), but an emulator may have it and run it slowly: under QEMU's TCG, PCLMULQDQ is a helper call,
// and folding ran at 0.21 GB/s against slice-by-8's 0.41. So where both exist, the faster on this machine is chosen
// by timing each on a 4 KiB packet's bytes (the cheaper of 3 tries; ~10 us here, ~1 ms under TCG), at the first CRC
// rather than when the library loads: a program that loads it and never sends a packet pays nothing.
bool FoldingIsFaster() {
  if (!kHaveClmul) return false;
  alignas(64) static uint8_t bytes[4096];
  const auto cost = [](uint32_t (*crc_fn)(uint32_t, const uint8_t*, size_t)) {
    uint32_t sink = 0;
    const uint64_t best = CheapestNs(SystemClock::Instance(), 3, [&] { sink ^= crc_fn(sink, bytes, sizeof bytes); });
    asm volatile("" : : "r"(sink));
    return best;
  };
  return cost(RawFolding) <= cost(RawSliceBy8);
}

inline uint32_t RawCrc(uint32_t crc, const uint8_t* p, size_t len) {
  static const bool use_folding = FoldingIsFaster();
  return use_folding ? RawFolding(crc, p, len) : RawSliceBy8(crc, p, len);
}

// The masked pseudo-header (A17.3.3) up to and including the BTH; see icrc.h. Returns its length.
size_t BuildMaskedPrefix(const Flow& flow, std::span<const uint8_t> packet, uint8_t* out) {
  const size_t udp_length = kUdpHeaderSize + packet.size();
  size_t n = 0;
  std::memset(out, 0xFF, 8);  // stands for the LRH
  n += 8;
  const bool v4 = flow.src.addr.is_v4() && flow.dst.addr.is_v4();
  if (v4) {
    uint8_t* ip = out + n;
    ip[0] = 0x45;  // version 4, IHL 5
    ip[1] = 0xFF;  // TOS (DSCP + ECN) masked
    StoreBe16(ip + 2, static_cast<uint16_t>(kIpv4HeaderSize + udp_length));
    StoreBe16(ip + 4, flow.ip_id);
    StoreBe16(ip + 6, 0x4000);  // DF, offset 0
    ip[8] = 0xFF;               // TTL masked
    ip[9] = kIpProtoUdp;
    ip[10] = ip[11] = 0xFF;  // header checksum masked
    std::memcpy(ip + 12, flow.src.addr.bytes().data() + 12, 4);
    std::memcpy(ip + 16, flow.dst.addr.bytes().data() + 12, 4);
    n += kIpv4HeaderSize;
  } else {
    uint8_t* ip = out + n;
    ip[0] = 0x6F;  // version 6, traffic class and flow label masked
    ip[1] = ip[2] = ip[3] = 0xFF;
    StoreBe16(ip + 4, static_cast<uint16_t>(udp_length));
    ip[6] = kIpProtoUdp;
    ip[7] = 0xFF;  // hop limit masked
    std::memcpy(ip + 8, flow.src.addr.bytes().data(), 16);
    std::memcpy(ip + 24, flow.dst.addr.bytes().data(), 16);
    n += kIpv6HeaderSize;
  }
  uint8_t* udp = out + n;
  StoreBe16(udp, flow.src.port);
  StoreBe16(udp + 2, flow.dst.port);
  StoreBe16(udp + 4, static_cast<uint16_t>(udp_length));
  udp[6] = udp[7] = 0xFF;  // UDP checksum masked
  n += kUdpHeaderSize;
  std::memcpy(out + n, packet.data(), Bth::kSize);
  out[n + 4] = 0xFF;  // FECN, BECN, reserved
  n += Bth::kSize;
  return n;
}

// ---- GF(2) arithmetic modulo P, for RecoverIpId ------------------------------------------------------------------
// In the reflected representation bit 31 stands for x^0 and bit 0 for x^31.
constexpr uint32_t kXPow0 = 0x80000000;

uint32_t MulModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int bit = 31; bit >= 0; --bit) {  // a's terms from x^0 upwards, while b runs through b * x^k
    if ((a >> bit) & 1) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(8 * bytes) mod P: the factor by which `bytes` zero bytes advance a zero-initialised CRC register.
uint32_t XPowBytes(size_t bytes) {
  uint32_t result = kXPow0;
  uint32_t square = kXPow0 >> 8;  // x^8
  for (; bytes != 0; bytes >>= 1) {
    if (bytes & 1) result = MulModP(result, square);
    square = MulModP(square, square);
  }
  return result;
}

// The linear map from the 16 IP ID bits to the change they cause in the ICRC, for one packet length, in echelon
// form: basis[b] has highest set bit b (or is 0), and is the ICRC change caused by the ID bits in mask[b].
struct IpIdSolver {
  size_t packet_size = 0;
  uint32_t basis[32] = {};
  uint16_t mask[32] = {};
  uint32_t bit_change[16] = {};  // the ICRC change caused by ID bit i alone (IcrcIpIdChange)

  void Build(size_t size) {
    packet_size = size;
    std::memset(basis, 0, sizeof basis);
    std::memset(mask, 0, sizeof mask);
    // Pseudo-header stream: 8 (LRH) + 20 (IPv4) + 8 (UDP) + packet without ICRC; the ID sits at bytes 12-13.
    const size_t stream = 8 + kIpv4HeaderSize + kUdpHeaderSize + size - kIcrcSize;
    const uint32_t shift = XPowBytes(stream - 14);
    for (int i = 0; i < 16; ++i) {
      const uint16_t id = static_cast<uint16_t>(1u << i);
      const uint8_t bytes[2] = {static_cast<uint8_t>(id >> 8), static_cast<uint8_t>(id)};
      bit_change[i] = MulModP(RawSliceBy8(0, bytes, 2), shift);
      Insert(bit_change[i], id);
    }
  }
  void Insert(uint32_t v, uint16_t m) {
    for (int b = 31; b >= 0 && v != 0; --b) {
      if (!((v >> b) & 1)) continue;
      if (basis[b] == 0) {
        basis[b] = v;
        mask[b] = m;
        return;
      }
      v ^= basis[b];
      m ^= mask[b];
    }
  }
  std::optional<uint16_t> Solve(uint32_t delta) const {
    uint16_t m = 0;
    for (int b = 31; b >= 0 && delta != 0; --b) {
      if (!((delta >> b) & 1)) continue;
      if (basis[b] == 0) return std::nullopt;
      delta ^= basis[b];
      m ^= mask[b];
    }
    return m;
  }
};

// The linear map for one packet length, cached per thread for the last few lengths seen: an RC stream mixes at least
// three (FIRST with its RETH, MIDDLE/LAST, ACK), which must not evict one another.
const IpIdSolver& SolverFor(size_t packet_size) {
  constexpr size_t kWays = 8;
  static thread_local IpIdSolver cache[kWays];
  static thread_local size_t next_victim = 0;
  for (IpIdSolver& solver : cache) {
    if (solver.packet_size == packet_size) return solver;
  }
  IpIdSolver& solver = cache[next_victim];
  next_victim = (next_victim + 1) % kWays;
  solver.Build(packet_size);
  return solver;
}

}  // namespace

// Exposed for icrc_test: advancing a register through zero bytes equals multiplying by x^(8n).
uint32_t IcrcInternalMulModP(uint32_t a, uint32_t b) { return MulModP(a, b); }
uint32_t IcrcInternalXPowBytes(size_t bytes) { return XPowBytes(bytes); }

bool HaveClmul() { return kHaveClmul; }
bool HaveVpclmul() { return kHaveVpclmul; }
bool HaveVpclmul256() { return kHaveVpclmul256; }

uint32_t Crc32SliceBy8(uint32_t crc, const uint8_t* data, size_t len) { return ~RawSliceBy8(~crc, data, len); }
uint32_t Crc32Clmul(uint32_t crc, const uint8_t* data, size_t len) { return ~RawClmul(~crc, data, len); }
uint32_t Crc32Vpclmul(uint32_t crc, const uint8_t* data, size_t len) { return ~RawVpclmul(~crc, data, len); }
uint32_t Crc32Vpclmul256(uint32_t crc, const uint8_t* data, size_t len) {
  return ~RawVpclmul256(~crc, data, len);
}
uint32_t Crc32(uint32_t crc, const uint8_t* data, size_t len) { return ~RawCrc(~crc, data, len); }

uint32_t ComputeIcrc(const Flow& flow, std::span<const uint8_t> packet) {
  if (packet.size() < kMinPacketSize) return 0;
  uint8_t prefix[8 + kIpv6HeaderSize + kUdpHeaderSize + Bth::kSize];
  const size_t n = BuildMaskedPrefix(flow, packet, prefix);
  uint32_t crc = RawCrc(0xFFFFFFFF, prefix, n);
  crc = RawCrc(crc, packet.data() + Bth::kSize, packet.size() - Bth::kSize - kIcrcSize);
  return ~crc;
}

void SealIcrc(const Flow& flow, std::span<uint8_t> packet) {
  if (packet.size() < kMinPacketSize) return;
  StoreLe32(packet.data() + packet.size() - kIcrcSize, ComputeIcrc(flow, packet));
}

std::optional<uint16_t> RecoverIpId(const Flow& flow, std::span<const uint8_t> packet) {
  if (packet.size() < kMinPacketSize) return std::nullopt;
  const uint32_t got = LoadLe32(packet.data() + packet.size() - kIcrcSize);
  Flow zero_id = flow;
  zero_id.ip_id = 0;
  const uint32_t want = ComputeIcrc(zero_id, packet);
  if (!(flow.src.addr.is_v4() && flow.dst.addr.is_v4())) {
    if (got == want) return 0;
    return std::nullopt;
  }
  // F(id) = F(0) ^ L(id) for a linear L; find id with L(id) == got ^ F(0).
  return SolverFor(packet.size()).Solve(got ^ want);
}

uint32_t IcrcIpIdChange(size_t packet_size, uint16_t id_xor) {
  if (packet_size < kMinPacketSize || id_xor == 0) return 0;
  const IpIdSolver& solver = SolverFor(packet_size);
  uint32_t change = 0;
  for (int i = 0; i < 16; ++i) {
    if ((id_xor >> i) & 1) change ^= solver.bit_change[i];
  }
  return change;
}

IcrcCheck VerifyIcrc(const Flow& flow, std::span<const uint8_t> packet) {
  IcrcCheck check;
  if (packet.size() < kMinPacketSize) return check;
  check.got = LoadLe32(packet.data() + packet.size() - kIcrcSize);
  check.want = ComputeIcrc(flow, packet);
  check.ok = check.got == check.want;
  return check;
}

}  // namespace uroce::wire
