// The IB Communication Manager's messages (IBTA vol. 1 ch. 12, tables 106-120) as MADs on QP1 (GSI), and the
// rdma_cm private-data header (IBTA Annex A11 "IP CM"), byte for byte as the Linux kernel's ib_cm/rdma_cm speak them
// over RoCEv2. Pure bytes: which connection a message belongs to is emu/connection_manager's business.
//
// A CM MAD travels as a UD SEND_ONLY (BTH opcode 0x64, P_Key 0xFFFF, DestQP 1) with a DETH (Q_Key 0x80010000, SrcQP
// 1), and is always the full 256 bytes: the kernel takes an IB MAD as 256 bytes whatever the datagram's length.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <variant>

#include "wire/address.h"
#include "wire/expected.h"
#include "wire/headers.h"  // kDefaultPkey

namespace uroce::wire {

inline constexpr uint32_t kGsiQpn = 1;                   // QP1, the General Services Interface (IBTA 3.5.4)
inline constexpr uint32_t kGsiQkey = 0x80010000u;        // IBTA 13.4.3.1: the well-known Q_Key of QP1
inline constexpr size_t kMadSize = 256;                  // IBTA 13.4.2: every MAD is 256 bytes
inline constexpr size_t kMadHeaderSize = 24;
inline constexpr uint8_t kMadBaseVersion = 1;
inline constexpr uint8_t kMgmtClassCm = 0x07;            // IBTA 13.4.4: Communication Management
inline constexpr uint8_t kCmClassVersion = 2;            // the version the kernel's CM agent registers
inline constexpr uint8_t kMadMethodSend = 0x03;          // CM messages are all SEND, never responses

// Attribute IDs of the CM class (IBTA table 102).
enum class CmAttribute : uint16_t {
  kClassPortInfo = 0x0001,
  kReq = 0x0010,
  kMra = 0x0011,
  kRej = 0x0012,
  kRep = 0x0013,
  kRtu = 0x0014,
  kDreq = 0x0015,
  kDrep = 0x0016,
  kSidrReq = 0x0017,
  kSidrRep = 0x0018,
  kLap = 0x0019,
  kApr = 0x001A,
};
// "REQ", "MRA", ..., "ClassPortInfo", "LAP", "APR" (static strings); "ATTR_0x1234" for others, in a per-thread
// buffer that the next call on the same thread overwrites.
std::string_view ToString(CmAttribute a);

// Private-data field sizes (IBTA tables 106-120).
inline constexpr size_t kReqPrivateDataSize = 92;
inline constexpr size_t kMraPrivateDataSize = 222;
inline constexpr size_t kRejPrivateDataSize = 148;
inline constexpr size_t kRejAriSize = 72;
inline constexpr size_t kRepPrivateDataSize = 196;
inline constexpr size_t kRtuPrivateDataSize = 224;
inline constexpr size_t kDreqPrivateDataSize = 220;
inline constexpr size_t kDrepPrivateDataSize = 224;
inline constexpr size_t kSidrReqPrivateDataSize = 216;
inline constexpr size_t kSidrRepPrivateDataSize = 136;
inline constexpr size_t kSidrRepAdditionalInfoSize = 72;

using Gid = std::array<uint8_t, 16>;

// One path of a REQ (primary or alternate; IBTA table 106 bytes 52-95 / 96-139 of the message).
struct CmReqPath {
  uint16_t local_lid = 0;
  uint16_t remote_lid = 0;
  Gid local_gid{};
  Gid remote_gid{};
  uint32_t flow_label = 0;  // 20 bits
  uint8_t packet_rate = 0;  // 6 bits
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  uint8_t sl = 0;  // 4 bits
  bool subnet_local = false;
  uint8_t local_ack_timeout = 0;  // 5 bits: 4.096 us x 2^n
  bool operator==(const CmReqPath&) const = default;
};

// Transport Service Type of a REQ (2 bits); XRC is kExtended with extended_transport_type 1.
enum class CmTransport : uint8_t { kRc = 0, kUc = 1, kRd = 2, kExtended = 3 };

struct CmReq {
  uint32_t local_comm_id = 0;
  uint32_t vendor_id = 0;  // 24 bits (ECE)
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;  // 24 bits
  uint8_t responder_resources = 0;
  uint32_t local_eecn = 0;  // 24 bits
  uint8_t initiator_depth = 0;
  uint32_t remote_eecn = 0;                 // 24 bits
  uint8_t remote_cm_response_timeout = 0;   // 5 bits
  CmTransport transport = CmTransport::kRc;
  bool flow_control = false;
  uint32_t starting_psn = 0;               // 24 bits
  uint8_t local_cm_response_timeout = 0;   // 5 bits
  uint8_t retry_count = 0;                 // 3 bits
  uint16_t pkey = kDefaultPkey;
  uint8_t path_mtu = 0;                    // 4 bits, IB enum (1 = 256 ... 5 = 4096)
  bool rdc_exists = false;
  uint8_t rnr_retry_count = 0;             // 3 bits
  uint8_t max_cm_retries = 0;              // 4 bits
  bool srq = false;
  uint8_t extended_transport_type = 0;     // 3 bits; 1 with kExtended = XRC
  CmReqPath primary;
  CmReqPath alternate;
  bool alternate_sap_supported = false;
  std::array<uint8_t, kReqPrivateDataSize> private_data{};
  bool operator==(const CmReq&) const = default;
};

// Which message an MRA or REJ refers to (2 bits).
enum class CmMessageRef : uint8_t { kReq = 0, kRep = 1, kOther = 2 };

struct CmMra {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  CmMessageRef message_mraed = CmMessageRef::kReq;
  uint8_t service_timeout = 0;  // 5 bits
  std::array<uint8_t, kMraPrivateDataSize> private_data{};
  bool operator==(const CmMra&) const = default;
};

// REJ reasons the kernel's rdma_cm sends or expects (IBTA table 109).
enum class CmRejectReason : uint16_t {
  kNoQp = 1,
  kTimeout = 4,
  kInvalidServiceId = 8,
  kStaleConnection = 10,
  kInvalidGid = 12,
  kConsumerDefined = 28,
  kVendorOptionNotSupported = 35,
};
// The kernel's name of any reason of table 109, named or not above ("NO_QP", "INVALID_SERVICE_ID", "STALE_CONN",
// ...); "reserved" for 0, 34 and above 35.
std::string_view ToString(CmRejectReason r);

struct CmRej {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  CmMessageRef message_rejected = CmMessageRef::kReq;
  uint8_t reject_info_length = 0;  // 7 bits
  uint16_t reason = 0;
  std::array<uint8_t, kRejAriSize> ari{};
  std::array<uint8_t, kRejPrivateDataSize> private_data{};
  bool operator==(const CmRej&) const = default;
};

struct CmRep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;     // 24 bits
  uint32_t local_eecn = 0;    // 24 bits (an XRC target puts its QPN here)
  uint32_t starting_psn = 0;  // 24 bits
  uint32_t vendor_id = 0;     // 24 bits, split over bytes 15, 19, 23 (ECE)
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 0;  // 5 bits
  uint8_t failover_accepted = 0;  // 2 bits
  bool flow_control = false;
  uint8_t rnr_retry_count = 0;  // 3 bits
  bool srq = false;
  uint64_t local_ca_guid = 0;
  std::array<uint8_t, kRepPrivateDataSize> private_data{};
  bool operator==(const CmRep&) const = default;
};

struct CmRtu {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  std::array<uint8_t, kRtuPrivateDataSize> private_data{};
  bool operator==(const CmRtu&) const = default;
};

struct CmDreq {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t remote_qpn = 0;  // 24 bits: the receiver's QPN (the kernel drops a DREQ naming another)
  std::array<uint8_t, kDreqPrivateDataSize> private_data{};
  bool operator==(const CmDreq&) const = default;
};

struct CmDrep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  std::array<uint8_t, kDrepPrivateDataSize> private_data{};
  bool operator==(const CmDrep&) const = default;
};

struct CmSidrReq {
  uint32_t request_id = 0;
  uint16_t pkey = kDefaultPkey;
  uint64_t service_id = 0;
  std::array<uint8_t, kSidrReqPrivateDataSize> private_data{};
  bool operator==(const CmSidrReq&) const = default;
};

// SIDR_REP status (IBTA table 120).
enum class SidrStatus : uint8_t {
  kSuccess = 0,
  kUnsupported = 1,  // no service (listener) for the ID
  kReject = 2,
  kNoQp = 3,
  kRedirect = 4,
  kUnsupportedVersion = 5,
};
// "SUCCESS", "UNSUPPORTED", "REJECT", "NO_QP", "REDIRECT", "UNSUPPORTED_VERSION"; "reserved" for others.
std::string_view ToString(SidrStatus s);

struct CmSidrRep {
  uint32_t request_id = 0;
  SidrStatus status = SidrStatus::kSuccess;
  uint8_t additional_info_length = 0;
  uint32_t vendor_id = 0;  // 24 bits: high 16 at byte 6, low 8 at byte 11
  uint32_t qpn = 0;        // 24 bits
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  std::array<uint8_t, kSidrRepAdditionalInfoSize> additional_info{};
  std::array<uint8_t, kSidrRepPrivateDataSize> private_data{};
  bool operator==(const CmSidrRep&) const = default;
};

using CmMessage = std::variant<CmReq, CmMra, CmRej, CmRep, CmRtu, CmDreq, CmDrep, CmSidrReq, CmSidrRep>;
CmAttribute AttributeOf(const CmMessage& m);

struct CmMad {
  uint64_t transaction_id = 0;
  uint32_t attribute_modifier = 0;
  CmMessage message;
};

enum class MadError : uint8_t {
  kTruncated,            // shorter than 256 bytes
  kBadBaseVersion,       // not 1
  kNotCm,                // management class is not 0x07
  kBadClassVersion,      // CM class version not 2
  kBadMethod,            // not SEND (0x03)
  kUnsupportedAttribute, // ClassPortInfo, LAP, APR and unknown attributes
};
std::string_view ToString(MadError e);

// The 256-byte MAD: common header (base version 1, class 0x07, class version 2, method SEND, status 0) + message,
// zero-padded.
std::array<uint8_t, kMadSize> EncodeCmMad(const CmMad& mad);
Expected<CmMad, MadError> ParseCmMad(std::span<const uint8_t> mad);

// What a CM answers a REQ or SIDR_REQ for a service ID nobody listens on, as the kernel's does (cm_issue_rej,
// cm_sidr_req_handler): REJ "invalid service ID" naming the REQ's comm ID (rdma_connect's ECONNREFUSED), or
// SIDR_REP "unsupported"; the request's TID reused. nullopt for any other message.
std::optional<CmMad> NoListenerAnswer(const CmMad& request);

// The headers of a MAD's packet (rdmacm.md 4.1): a UD SEND_ONLY from QP1 to QP1 with the GSI Q_Key, PSN `psn`; the
// payload is the full 256-byte MAD.
struct PacketSpec;
PacketSpec GsiMadSpec(uint32_t psn);

// --- rdma_cm over IP (Annex A11 "IP CM"; the kernel's struct cma_hdr) ------------------------------------------

inline constexpr size_t kCmaHeaderSize = 36;
// Port spaces of rdma_cm (enum rdma_port_space): the service ID is (ps << 16) | port.
inline constexpr uint16_t kPortSpaceIpoib = 0x0002;
inline constexpr uint16_t kPortSpaceTcp = 0x0106;
inline constexpr uint16_t kPortSpaceUdp = 0x0111;
inline constexpr uint16_t kPortSpaceIb = 0x013F;

inline constexpr uint64_t ServiceIdOf(uint16_t port_space, uint16_t port) {
  return (uint64_t{port_space} << 16) | port;
}
inline constexpr uint16_t PortSpaceOf(uint64_t service_id) { return static_cast<uint16_t>(service_id >> 16); }
inline constexpr uint16_t PortOf(uint64_t service_id) { return static_cast<uint16_t>(service_id); }

// The first 36 bytes of a REQ's or SIDR_REQ's private data: version 0, IP version in the high nibble of byte 1
// (4 or 6), the active side's source port, its address and the address it dialled. IPv4 addresses sit in the last
// 4 of their 16 bytes with zeros before (not ::ffff-mapped).
struct CmaHeader {
  uint16_t src_port = 0;
  IpAddress src;
  IpAddress dst;
  bool operator==(const CmaHeader&) const = default;
};
// IP version from `src` (both addresses must be of one family).
std::array<uint8_t, kCmaHeaderSize> EncodeCmaHeader(const CmaHeader& h);
// nullopt for fewer than 36 bytes, a version other than 0, or an IP version other than 4 or 6.
std::optional<CmaHeader> ParseCmaHeader(std::span<const uint8_t> private_data);

// ms the kernel waits for a CM time value t (4.096 us x 2^t): 1 << max(t - 8, 0), as cm_convert_to_ms.
inline constexpr uint64_t CmTimeoutMs(uint8_t t) { return uint64_t{1} << (t > 8 ? t - 8 : 0); }

}  // namespace uroce::wire
