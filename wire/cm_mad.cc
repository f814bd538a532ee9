#include "wire/cm_mad.h"

#include <bit>
#include <concepts>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "wire/bytes.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace uroce::wire {
namespace {

// --- One description of each layout, read in both directions ----------------------------------------------------
//
// A layout is a function template `Layout(io, m)` that names every field once: where it sits and which bits it
// takes. `FieldIo<true>` runs it to write `m` into the bytes, `FieldIo<false>` to read the bytes into `m`, so an
// offset is never written twice. Offsets are relative to the buffer `io` was given (the CM message for messages,
// i.e. MAD byte 24; the MAD for its header; the private data for the cma_hdr).

template <bool kEncode>
class FieldIo {
 public:
  using Pointer = std::conditional_t<kEncode, uint8_t*, const uint8_t*>;
  explicit FieldIo(Pointer base) : base_(base) {}

  // The bits `mask` of the big-endian `size`-byte word at `offset` (1 <= size <= 8) hold bits [value_shift, ...)
  // of `value`. IBTA's "bits 7..3 of byte 43" is Int(43, 1, 0xF8, v); a field split over several places (the
  // ECE vendor ID of REP and SIDR_REP) is one Int per piece, each with the shift of its part of the value.
  // Encoding keeps the word's other bits; decoding keeps the value's other bits.
  template <typename T>
  void Int(size_t offset, size_t size, uint64_t mask, T& value, int value_shift = 0) {
    const int shift = std::countr_zero(mask);
    uint64_t word = 0;
    for (size_t i = 0; i < size; ++i) word = (word << 8) | base_[offset + i];
    if constexpr (kEncode) {
      const uint64_t bits = static_cast<uint64_t>(value) >> value_shift;
      word = (word & ~mask) | ((bits << shift) & mask);
      for (size_t i = size; i-- > 0; word >>= 8) base_[offset + i] = static_cast<uint8_t>(word);
    } else {
      using V = std::remove_const_t<T>;
      const uint64_t part_mask = (mask >> shift) << value_shift;
      const uint64_t part = ((word & mask) >> shift) << value_shift;
      value = static_cast<V>((static_cast<uint64_t>(value) & ~part_mask) | part);
    }
  }
  template <typename T>
  void U8(size_t offset, T& value) { Int(offset, 1, 0xFF, value); }
  template <typename T>
  void U16(size_t offset, T& value) { Int(offset, 2, 0xFFFF, value); }
  template <typename T>
  void U24(size_t offset, T& value) { Int(offset, 3, 0xFFFFFF, value); }
  template <typename T>
  void U32(size_t offset, T& value) { Int(offset, 4, 0xFFFFFFFF, value); }
  template <typename T>
  void U64(size_t offset, T& value) { Int(offset, 8, ~uint64_t{0}, value); }
  // One bit of a byte, as a bool.
  template <typename T>
  void Flag(size_t offset, uint8_t bit, T& value) { Int(offset, 1, bit, value); }

  template <typename A>
  void Bytes(size_t offset, A& bytes) {
    if constexpr (kEncode) {
      std::memcpy(base_ + offset, bytes.data(), bytes.size());
    } else {
      std::memcpy(bytes.data(), base_ + offset, bytes.size());
    }
  }

 private:
  Pointer base_;
};

// `M` is `T` or `const T`: a layout takes the message it fills (decoding) or reads (encoding).
template <typename M, typename T>
concept Is = std::same_as<std::remove_const_t<M>, T>;

// IBTA 13.4.2 / rdmacm.md 4.2: the common MAD header (MAD bytes 0-23).
struct MadHeader {
  uint8_t base_version = kMadBaseVersion;
  uint8_t mgmt_class = kMgmtClassCm;
  uint8_t class_version = kCmClassVersion;
  uint8_t method = kMadMethodSend;  // the whole byte: R (response) bit and method
  uint16_t status = 0;
  uint64_t transaction_id = 0;
  uint16_t attribute_id = 0;
  uint32_t attribute_modifier = 0;
};

template <typename Io, Is<MadHeader> H>
void Layout(Io& io, H& h) {
  io.U8(0, h.base_version);
  io.U8(1, h.mgmt_class);
  io.U8(2, h.class_version);
  io.U8(3, h.method);
  io.U16(4, h.status);
  // 6-7 class specific, 18-19 reserved: 0.
  io.U64(8, h.transaction_id);
  io.U16(16, h.attribute_id);
  io.U32(20, h.attribute_modifier);
}

// One path of a REQ, relative to its first byte (primary: message byte 52, alternate: 96).
template <typename Io, Is<CmReqPath> P>
void LayoutPath(Io& io, size_t at, P& p) {
  io.U16(at + 0, p.local_lid);
  io.U16(at + 2, p.remote_lid);
  io.Bytes(at + 4, p.local_gid);
  io.Bytes(at + 20, p.remote_gid);
  io.Int(at + 36, 4, 0xFFFFF000, p.flow_label);
  io.Int(at + 39, 1, 0x3F, p.packet_rate);
  io.U8(at + 40, p.traffic_class);
  io.U8(at + 41, p.hop_limit);
  io.Int(at + 42, 1, 0xF0, p.sl);
  io.Flag(at + 42, 0x08, p.subnet_local);
  io.Int(at + 43, 1, 0xF8, p.local_ack_timeout);
}

// IBTA table 106.
template <typename Io, Is<CmReq> M>
void Layout(Io& io, M& m) {
  io.U32(0, m.local_comm_id);
  io.U24(5, m.vendor_id);
  io.U64(8, m.service_id);
  io.U64(16, m.local_ca_guid);
  io.U32(28, m.local_qkey);
  io.U24(32, m.local_qpn);
  io.U8(35, m.responder_resources);
  io.U24(36, m.local_eecn);
  io.U8(39, m.initiator_depth);
  io.U24(40, m.remote_eecn);
  io.Int(43, 1, 0xF8, m.remote_cm_response_timeout);
  io.Int(43, 1, 0x06, m.transport);
  io.Flag(43, 0x01, m.flow_control);
  io.U24(44, m.starting_psn);
  io.Int(47, 1, 0xF8, m.local_cm_response_timeout);
  io.Int(47, 1, 0x07, m.retry_count);
  io.U16(48, m.pkey);
  io.Int(50, 1, 0xF0, m.path_mtu);
  io.Flag(50, 0x08, m.rdc_exists);
  io.Int(50, 1, 0x07, m.rnr_retry_count);
  io.Int(51, 1, 0xF0, m.max_cm_retries);
  io.Flag(51, 0x08, m.srq);
  io.Int(51, 1, 0x07, m.extended_transport_type);
  LayoutPath(io, 52, m.primary);
  LayoutPath(io, 96, m.alternate);
  io.Flag(139, 0x04, m.alternate_sap_supported);
  io.Bytes(140, m.private_data);
}

// Every message of a connection (all but REQ and SIDR) opens with the sender's and the receiver's communication IDs.
template <typename Io, typename M>
void CommIds(Io& io, M& m) {
  io.U32(0, m.local_comm_id);
  io.U32(4, m.remote_comm_id);
}

// Table 107.
template <typename Io, Is<CmMra> M>
void Layout(Io& io, M& m) {
  CommIds(io, m);
  io.Int(8, 1, 0xC0, m.message_mraed);
  io.Int(9, 1, 0xF8, m.service_timeout);
  io.Bytes(10, m.private_data);
}

// Table 108.
template <typename Io, Is<CmRej> M>
void Layout(Io& io, M& m) {
  CommIds(io, m);
  io.Int(8, 1, 0xC0, m.message_rejected);
  io.Int(9, 1, 0xFE, m.reject_info_length);
  io.U16(10, m.reason);
  io.Bytes(12, m.ari);
  io.Bytes(84, m.private_data);
}

// Table 110. The vendor ID's high, middle and low bytes follow the three 24-bit fields.
template <typename Io, Is<CmRep> M>
void Layout(Io& io, M& m) {
  CommIds(io, m);
  io.U32(8, m.local_qkey);
  io.U24(12, m.local_qpn);
  io.Int(15, 1, 0xFF, m.vendor_id, 16);
  io.U24(16, m.local_eecn);
  io.Int(19, 1, 0xFF, m.vendor_id, 8);
  io.U24(20, m.starting_psn);
  io.Int(23, 1, 0xFF, m.vendor_id, 0);
  io.U8(24, m.responder_resources);
  io.U8(25, m.initiator_depth);
  io.Int(26, 1, 0xF8, m.target_ack_delay);
  io.Int(26, 1, 0x06, m.failover_accepted);
  io.Flag(26, 0x01, m.flow_control);
  io.Int(27, 1, 0xE0, m.rnr_retry_count);
  io.Flag(27, 0x10, m.srq);
  io.U64(28, m.local_ca_guid);
  io.Bytes(36, m.private_data);
}

// Tables 111 (RTU) and 113 (DREP): the two IDs and private data.
template <typename Io, typename M>
  requires Is<M, CmRtu> || Is<M, CmDrep>
void Layout(Io& io, M& m) {
  CommIds(io, m);
  io.Bytes(8, m.private_data);
}

// Table 112.
template <typename Io, Is<CmDreq> M>
void Layout(Io& io, M& m) {
  CommIds(io, m);
  io.U24(8, m.remote_qpn);
  io.Bytes(12, m.private_data);
}

// Table 119.
template <typename Io, Is<CmSidrReq> M>
void Layout(Io& io, M& m) {
  io.U32(0, m.request_id);
  io.U16(4, m.pkey);
  io.U64(8, m.service_id);
  io.Bytes(16, m.private_data);
}

// Table 120. The vendor ID's high 16 bits sit before the QPN, its low 8 after.
template <typename Io, Is<CmSidrRep> M>
void Layout(Io& io, M& m) {
  io.U32(0, m.request_id);
  io.U8(4, m.status);
  io.U8(5, m.additional_info_length);
  io.Int(6, 2, 0xFFFF, m.vendor_id, 8);
  io.U24(8, m.qpn);
  io.Int(11, 1, 0xFF, m.vendor_id, 0);
  io.U64(12, m.service_id);
  io.U32(20, m.qkey);
  io.Bytes(24, m.additional_info);
  io.Bytes(96, m.private_data);
}

// The cma_hdr as it sits on the wire (rdmacm.md 4.5).
struct CmaWire {
  uint8_t version = 0;
  uint8_t ip_version = 0;  // 4 or 6
  uint16_t port = 0;
  Gid src{};
  Gid dst{};
};

template <typename Io, Is<CmaWire> H>
void Layout(Io& io, H& h) {
  io.U8(0, h.version);
  io.Int(1, 1, 0xF0, h.ip_version);
  io.U16(2, h.port);
  io.Bytes(4, h.src);
  io.Bytes(20, h.dst);
}

template <size_t N, typename T>
std::array<uint8_t, N> Encode(const T& value) {
  std::array<uint8_t, N> out{};
  FieldIo<true> io(out.data());
  Layout(io, value);
  return out;
}

template <typename T>
T Decode(const uint8_t* in) {
  T value;
  FieldIo<false> io(in);
  Layout(io, value);
  return value;
}

// The attribute of each alternative of CmMessage, in the variant's order.
constexpr CmAttribute kMessageAttributes[] = {
    CmAttribute::kReq,  CmAttribute::kMra,  CmAttribute::kRej,     CmAttribute::kRep,     CmAttribute::kRtu,
    CmAttribute::kDreq, CmAttribute::kDrep, CmAttribute::kSidrReq, CmAttribute::kSidrRep,
};
static_assert(std::size(kMessageAttributes) == std::variant_size_v<CmMessage>);

// The message of `attribute` decoded from `msg` (MAD byte 24 on), or nullopt when no alternative carries it.
template <size_t I = 0>
std::optional<CmMessage> DecodeMessage(CmAttribute attribute, const uint8_t* msg) {
  if constexpr (I == std::variant_size_v<CmMessage>) {
    return std::nullopt;
  } else {
    if (attribute != kMessageAttributes[I]) return DecodeMessage<I + 1>(attribute, msg);
    return CmMessage(std::in_place_index<I>, Decode<std::variant_alternative_t<I, CmMessage>>(msg));
  }
}

// An IpAddress in the cma_hdr's 16 bytes: IPv4 in the last 4 with zeros before.
Gid CmaAddress(const IpAddress& a, bool v4) {
  if (!v4) return a.bytes();
  Gid g{};
  StoreBe32(g.data() + 12, a.v4());
  return g;
}

IpAddress FromCmaAddress(const Gid& g, bool v4) {
  return v4 ? IpAddress::V4(LoadBe32(g.data() + 12)) : IpAddress::FromBytes(g.data());
}

}  // namespace

std::string_view ToString(CmAttribute a) {
  switch (a) {
    case CmAttribute::kClassPortInfo: return "ClassPortInfo";
    case CmAttribute::kReq: return "REQ";
    case CmAttribute::kMra: return "MRA";
    case CmAttribute::kRej: return "REJ";
    case CmAttribute::kRep: return "REP";
    case CmAttribute::kRtu: return "RTU";
    case CmAttribute::kDreq: return "DREQ";
    case CmAttribute::kDrep: return "DREP";
    case CmAttribute::kSidrReq: return "SIDR_REQ";
    case CmAttribute::kSidrRep: return "SIDR_REP";
    case CmAttribute::kLap: return "LAP";
    case CmAttribute::kApr: return "APR";
  }
  thread_local char other[sizeof "ATTR_0x1234"];
  std::snprintf(other, sizeof other, "ATTR_0x%04x", static_cast<unsigned>(a));
  return other;
}

std::string_view ToString(CmRejectReason r) {
  // IBTA table 109 in the kernel's words (enum ib_cm_rej_reason), indexed by reason.
  static constexpr std::string_view kNames[] = {
      "reserved",
      "NO_QP",
      "NO_EEC",
      "NO_RESOURCES",
      "TIMEOUT",
      "UNSUPPORTED",
      "INVALID_COMM_ID",
      "INVALID_COMM_INSTANCE",
      "INVALID_SERVICE_ID",
      "INVALID_TRANSPORT_TYPE",
      "STALE_CONN",
      "RDC_NOT_EXIST",
      "INVALID_GID",
      "INVALID_LID",
      "INVALID_SL",
      "INVALID_TRAFFIC_CLASS",
      "INVALID_HOP_LIMIT",
      "INVALID_PACKET_RATE",
      "INVALID_ALT_GID",
      "INVALID_ALT_LID",
      "INVALID_ALT_SL",
      "INVALID_ALT_TRAFFIC_CLASS",
      "INVALID_ALT_HOP_LIMIT",
      "INVALID_ALT_PACKET_RATE",
      "PORT_CM_REDIRECT",
      "PORT_REDIRECT",
      "INVALID_MTU",
      "INSUFFICIENT_RESP_RESOURCES",
      "CONSUMER_DEFINED",
      "INVALID_RNR_RETRY",
      "DUPLICATE_LOCAL_COMM_ID",
      "INVALID_CLASS_VERSION",
      "INVALID_FLOW_LABEL",
      "INVALID_ALT_FLOW_LABEL",
      "reserved",
      "VENDOR_OPTION_NOT_SUPPORTED",
  };
  const auto i = static_cast<size_t>(r);
  return i < std::size(kNames) ? kNames[i] : "reserved";
}

std::string_view ToString(SidrStatus s) {
  static constexpr std::string_view kNames[] = {"SUCCESS",  "UNSUPPORTED", "REJECT",
                                                "NO_QP",    "REDIRECT",    "UNSUPPORTED_VERSION"};
  const auto i = static_cast<size_t>(s);
  return i < std::size(kNames) ? kNames[i] : "reserved";
}

std::string_view ToString(MadError e) {
  switch (e) {
    case MadError::kTruncated: return "MAD shorter than 256 bytes";
    case MadError::kBadBaseVersion: return "MAD base version not 1";
    case MadError::kNotCm: return "management class not CM (0x07)";
    case MadError::kBadClassVersion: return "CM class version not 2";
    case MadError::kBadMethod: return "method not SEND (0x03)";
    case MadError::kUnsupportedAttribute: return "unsupported CM attribute";
  }
  return "?";
}

CmAttribute AttributeOf(const CmMessage& m) { return kMessageAttributes[m.index()]; }

std::array<uint8_t, kMadSize> EncodeCmMad(const CmMad& mad) {
  MadHeader header;
  header.transaction_id = mad.transaction_id;
  header.attribute_id = static_cast<uint16_t>(AttributeOf(mad.message));
  header.attribute_modifier = mad.attribute_modifier;
  std::array<uint8_t, kMadSize> out{};
  FieldIo<true> header_io(out.data());
  Layout(header_io, header);
  FieldIo<true> message_io(out.data() + kMadHeaderSize);
  std::visit([&](const auto& message) { Layout(message_io, message); }, mad.message);
  return out;
}

std::optional<CmMad> NoListenerAnswer(const CmMad& request) {
  if (const auto* req = std::get_if<CmReq>(&request.message)) {
    CmRej rej;
    rej.local_comm_id = 0;  // the REQ's IDs swapped: it has no remote comm ID yet
    rej.remote_comm_id = req->local_comm_id;
    rej.message_rejected = CmMessageRef::kReq;
    rej.reason = static_cast<uint16_t>(CmRejectReason::kInvalidServiceId);
    return CmMad{request.transaction_id, 0, rej};
  }
  if (const auto* sidr = std::get_if<CmSidrReq>(&request.message)) {
    CmSidrRep rep;
    rep.request_id = sidr->request_id;
    rep.status = SidrStatus::kUnsupported;
    rep.service_id = sidr->service_id;
    return CmMad{request.transaction_id, 0, rep};
  }
  return std::nullopt;
}

PacketSpec GsiMadSpec(uint32_t psn) {
  PacketSpec spec;
  spec.bth.opcode = opcode::kUdSendOnly;
  spec.bth.pkey = kDefaultPkey;
  spec.bth.dest_qp = kGsiQpn;
  spec.bth.psn = psn & 0xFFFFFF;
  spec.deth = Deth{kGsiQkey, 0, kGsiQpn};
  return spec;
}

Expected<CmMad, MadError> ParseCmMad(std::span<const uint8_t> mad) {
  if (mad.size() < kMadSize) return Unexpected(MadError::kTruncated);
  const MadHeader header = Decode<MadHeader>(mad.data());
  if (header.base_version != kMadBaseVersion) return Unexpected(MadError::kBadBaseVersion);
  if (header.mgmt_class != kMgmtClassCm) return Unexpected(MadError::kNotCm);
  if (header.class_version != kCmClassVersion) return Unexpected(MadError::kBadClassVersion);
  if (header.method != kMadMethodSend) return Unexpected(MadError::kBadMethod);
  std::optional<CmMessage> message =
      DecodeMessage(static_cast<CmAttribute>(header.attribute_id), mad.data() + kMadHeaderSize);
  if (!message) return Unexpected(MadError::kUnsupportedAttribute);
  return CmMad{.transaction_id = header.transaction_id,
               .attribute_modifier = header.attribute_modifier,
               .message = std::move(*message)};
}

std::array<uint8_t, kCmaHeaderSize> EncodeCmaHeader(const CmaHeader& h) {
  const bool v4 = h.src.is_v4();
  const CmaWire wire{.version = 0,
                     .ip_version = static_cast<uint8_t>(v4 ? 4 : 6),
                     .port = h.src_port,
                     .src = CmaAddress(h.src, v4),
                     .dst = CmaAddress(h.dst, v4)};
  return Encode<kCmaHeaderSize>(wire);
}

std::optional<CmaHeader> ParseCmaHeader(std::span<const uint8_t> private_data) {
  if (private_data.size() < kCmaHeaderSize) return std::nullopt;
  const CmaWire wire = Decode<CmaWire>(private_data.data());
  if (wire.version != 0 || (wire.ip_version != 4 && wire.ip_version != 6)) return std::nullopt;
  const bool v4 = wire.ip_version == 4;
  return CmaHeader{.src_port = wire.port, .src = FromCmaAddress(wire.src, v4), .dst = FromCmaAddress(wire.dst, v4)};
}

}  // namespace uroce::wire
