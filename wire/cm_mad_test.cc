// The CM MAD codec against the layouts of shared/rdmacm.md 4.2-4.5 (IBTA vol. 1 tables 106-120 as the kernel's
// ibta_vol1_c12.h places them). The byte checks below spell every offset out as an absolute MAD byte (message
// offset + 24), written from the document rather than from cm_mad.cc's layouts, so a wrong layout cannot agree with
// itself.
#include "wire/cm_mad.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace uroce::wire {
namespace {

using Mad = std::array<uint8_t, kMadSize>;

// N bytes seed, seed+1, ... (wrapping): private data that shows where it starts and ends.
template <size_t N>
std::array<uint8_t, N> Pattern(uint8_t seed) {
  std::array<uint8_t, N> out{};
  for (size_t i = 0; i < N; ++i) out[i] = static_cast<uint8_t>(seed + i);
  return out;
}

// The bytes of `mad` from `offset` on, `n` of them, as one big-endian number.
uint64_t Be(const Mad& mad, size_t offset, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = (v << 8) | mad[offset + i];
  return v;
}

void ExpectRange(const Mad& mad, size_t offset, const uint8_t* want, size_t n, const char* what) {
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(mad[offset + i], want[i]) << what << " byte " << i << " (MAD " << offset + i << ")";
}

void ExpectZero(const Mad& mad, size_t from, size_t to, const char* what) {
  for (size_t i = from; i < to; ++i) ASSERT_EQ(mad[i], 0) << what << ": MAD byte " << i;
}

CmReqPath Path(uint8_t seed) {
  return CmReqPath{.local_lid = static_cast<uint16_t>(0xA100 + seed),
                   .remote_lid = static_cast<uint16_t>(0xB200 + seed),
                   .local_gid = Pattern<16>(seed),
                   .remote_gid = Pattern<16>(static_cast<uint8_t>(seed + 0x40)),
                   .flow_label = 0xABCDEu + seed,
                   .packet_rate = 0x2A,
                   .traffic_class = static_cast<uint8_t>(0xC0 + seed),
                   .hop_limit = 64,
                   .sl = 0xB,
                   .subnet_local = true,
                   .local_ack_timeout = 17};
}

CmReq FullReq() {
  return CmReq{.local_comm_id = 0x1234ABCD,
               .vendor_id = 0x00C0FFEE & 0xFFFFFF,
               .service_id = ServiceIdOf(kPortSpaceTcp, 7174),
               .local_ca_guid = 0x0250B6FFFE112233,
               .local_qkey = 0x01234567,
               .local_qpn = 0x000011,
               .responder_resources = 0x10,
               .local_eecn = 0xEEC001,
               .initiator_depth = 0x0F,
               .remote_eecn = 0xEEC002,
               .remote_cm_response_timeout = 20,
               .transport = CmTransport::kUc,
               .flow_control = true,
               .starting_psn = 0xABCDEF,
               .local_cm_response_timeout = 19,
               .retry_count = 7,
               .pkey = 0x8001,
               .path_mtu = 3,
               .rdc_exists = true,
               .rnr_retry_count = 6,
               .max_cm_retries = 15,
               .srq = true,
               .extended_transport_type = 5,
               .primary = Path(1),
               .alternate = Path(2),
               .alternate_sap_supported = true,
               .private_data = Pattern<kReqPrivateDataSize>(0x30)};
}

CmRep FullRep() {
  return CmRep{.local_comm_id = 0xCAFE0001,
               .remote_comm_id = 0x1234ABCD,
               .local_qkey = 0x0BADF00D,
               .local_qpn = 0x000022,
               .local_eecn = 0x000033,
               .starting_psn = 0x123456,
               .vendor_id = 0xA1B2C3,
               .responder_resources = 4,
               .initiator_depth = 5,
               .target_ack_delay = 15,
               .failover_accepted = 2,
               .flow_control = true,
               .rnr_retry_count = 7,
               .srq = true,
               .local_ca_guid = 0x1122334455667788,
               .private_data = Pattern<kRepPrivateDataSize>(0x90)};
}

CmSidrRep FullSidrRep() {
  return CmSidrRep{.request_id = 0x5151AAAA,
                   .status = SidrStatus::kRedirect,
                   .additional_info_length = 72,
                   .vendor_id = 0xD1E2F3,
                   .qpn = 0x00ABCD,
                   .service_id = ServiceIdOf(kPortSpaceUdp, 7174),
                   .qkey = 0x01234567,
                   .additional_info = Pattern<kSidrRepAdditionalInfoSize>(0x01),
                   .private_data = Pattern<kSidrRepPrivateDataSize>(0x80)};
}

// Every message, each field set to a value other than its default.
std::vector<CmMessage> EveryMessage() {
  return {
      FullReq(),
      CmMra{.local_comm_id = 0x11111111,
            .remote_comm_id = 0x22222222,
            .message_mraed = CmMessageRef::kOther,
            .service_timeout = 24,
            .private_data = Pattern<kMraPrivateDataSize>(0x11)},
      CmRej{.local_comm_id = 0x33333333,
            .remote_comm_id = 0x44444444,
            .message_rejected = CmMessageRef::kRep,
            .reject_info_length = 0x7F,
            .reason = static_cast<uint16_t>(CmRejectReason::kConsumerDefined),
            .ari = Pattern<kRejAriSize>(0xA0),
            .private_data = Pattern<kRejPrivateDataSize>(0x22)},
      FullRep(),
      CmRtu{.local_comm_id = 0x55555555, .remote_comm_id = 0x66666666, .private_data = Pattern<kRtuPrivateDataSize>(3)},
      CmDreq{.local_comm_id = 0x77777777,
             .remote_comm_id = 0x88888888,
             .remote_qpn = 0xFEDCBA,
             .private_data = Pattern<kDreqPrivateDataSize>(4)},
      CmDrep{.local_comm_id = 0x99999999, .remote_comm_id = 0xAAAAAAAA, .private_data = Pattern<kDrepPrivateDataSize>(5)},
      CmSidrReq{.request_id = 0xBBBBBBBB,
                .pkey = 0x7FFF,
                .service_id = 0x0000000001111C06,
                .private_data = Pattern<kSidrReqPrivateDataSize>(6)},
      FullSidrRep(),
  };
}

Mad EncodeWith(const CmMessage& message, uint64_t tid = 0x0102030405060708, uint32_t attr_mod = 0) {
  return EncodeCmMad(CmMad{.transaction_id = tid, .attribute_modifier = attr_mod, .message = message});
}

TEST(CmMad, EveryMessageRoundTrips) {
  std::set<CmAttribute> seen;
  for (const CmMessage& message : EveryMessage()) {
    const CmAttribute attribute = AttributeOf(message);
    SCOPED_TRACE(std::string(ToString(attribute)));
    seen.insert(attribute);
    const Mad mad = EncodeWith(message, 0xDEADBEEF00000000 | message.index(), 0xECE00000u + message.index());
    auto parsed = ParseCmMad(mad);
    ASSERT_TRUE(parsed.has_value()) << ToString(parsed.error());
    EXPECT_EQ(parsed->transaction_id, 0xDEADBEEF00000000 | message.index());
    EXPECT_EQ(parsed->attribute_modifier, 0xECE00000u + message.index());
    EXPECT_TRUE(parsed->message == message);
    EXPECT_EQ(EncodeCmMad(*parsed), mad);
  }
  EXPECT_EQ(seen.size(), std::variant_size_v<CmMessage>);
}

TEST(CmMad, CommonHeader) {
  const Mad mad = EncodeWith(CmRtu{}, 0x8877665544332211, 0xA5A5A5A5);
  const uint8_t header[] = {0x01, 0x07, 0x02, 0x03, 0, 0, 0, 0, 0x88, 0x77, 0x66, 0x55,
                            0x44, 0x33, 0x22, 0x11, 0x00, 0x14, 0, 0, 0xA5, 0xA5, 0xA5, 0xA5};
  ExpectRange(mad, 0, header, sizeof header, "header");
  // Attribute IDs at bytes 16-17 (rdmacm.md 4.2).
  const std::vector<uint16_t> ids = {0x0010, 0x0011, 0x0012, 0x0013, 0x0014, 0x0015, 0x0016, 0x0017, 0x0018};
  const std::vector<CmMessage> messages = EveryMessage();
  for (size_t i = 0; i < messages.size(); ++i) {
    EXPECT_EQ(Be(EncodeWith(messages[i]), 16, 2), ids[i]) << ToString(AttributeOf(messages[i]));
  }
}

TEST(CmMad, ReqBytes) {
  const CmReq req = FullReq();
  const Mad mad = EncodeWith(req);
  EXPECT_EQ(Be(mad, 24, 4), 0x1234ABCDu);      // local comm ID
  EXPECT_EQ(mad[28], 0);                        // reserved
  EXPECT_EQ(Be(mad, 29, 3), 0xC0FFEEu);         // vendor ID
  EXPECT_EQ(Be(mad, 32, 8), 0x0000000001061C06u);  // service ID: rping's port 7174 over TCP
  EXPECT_EQ(Be(mad, 40, 8), 0x0250B6FFFE112233u);  // local CA GUID
  ExpectZero(mad, 48, 52, "reserved");
  EXPECT_EQ(Be(mad, 52, 4), 0x01234567u);  // local Q_Key
  EXPECT_EQ(Be(mad, 56, 3), 0x000011u);    // local QPN
  EXPECT_EQ(mad[59], 0x10);                // responder resources
  EXPECT_EQ(Be(mad, 60, 3), 0xEEC001u);    // local EECN
  EXPECT_EQ(mad[63], 0x0F);                // initiator depth
  EXPECT_EQ(Be(mad, 64, 3), 0xEEC002u);    // remote EECN
  EXPECT_EQ(mad[67], (20 << 3) | (1 << 1) | 1);  // remote CM response timeout, TST UC, flow control
  EXPECT_EQ(Be(mad, 68, 3), 0xABCDEFu);    // starting PSN
  EXPECT_EQ(mad[71], (19 << 3) | 7);       // local CM response timeout, retry count
  EXPECT_EQ(Be(mad, 72, 2), 0x8001u);      // P_Key
  EXPECT_EQ(mad[74], 0x30 | 0x08 | 6);     // MTU 1024 in the high nibble, RDC exists, RNR retry count
  EXPECT_EQ(mad[75], 0xF0 | 0x08 | 5);     // max CM retries 15 in the high nibble, SRQ, extended transport type
  // Primary path.
  EXPECT_EQ(Be(mad, 76, 2), 0xA101u);
  EXPECT_EQ(Be(mad, 78, 2), 0xB201u);
  ExpectRange(mad, 80, req.primary.local_gid.data(), 16, "primary local GID");
  ExpectRange(mad, 96, req.primary.remote_gid.data(), 16, "primary remote GID");
  EXPECT_EQ(Be(mad, 112, 4) >> 12, 0xABCDFu);  // flow label: bits 31..12
  EXPECT_EQ(mad[115] & 0x3F, 0x2A);            // packet rate
  EXPECT_EQ(mad[116], 0xC1);                   // traffic class
  EXPECT_EQ(mad[117], 64);                     // hop limit
  EXPECT_EQ(mad[118], 0xB8);                   // SL 0xB, subnet local
  EXPECT_EQ(mad[119], 17 << 3);                // local ACK timeout in bits 7..3
  // Alternate path: the same 44 bytes later; SAP supported is bit 2 of its last byte.
  EXPECT_EQ(Be(mad, 120, 2), 0xA102u);
  EXPECT_EQ(Be(mad, 122, 2), 0xB202u);
  ExpectRange(mad, 124, req.alternate.local_gid.data(), 16, "alternate local GID");
  ExpectRange(mad, 140, req.alternate.remote_gid.data(), 16, "alternate remote GID");
  EXPECT_EQ(Be(mad, 156, 4), (0xABCE0u << 12) | 0x2A);
  EXPECT_EQ(mad[160], 0xC2);
  EXPECT_EQ(mad[161], 64);
  EXPECT_EQ(mad[162], 0xB8);
  EXPECT_EQ(mad[163], (17 << 3) | 0x04);
  // Private data: MAD bytes 164-255.
  ExpectRange(mad, 164, req.private_data.data(), kReqPrivateDataSize, "private data");
  EXPECT_EQ(164 + kReqPrivateDataSize, kMadSize);
}

TEST(CmMad, ReqFieldsAreMaskedToTheirWidth) {
  CmReq req;
  req.local_qpn = 0xFF000011;  // 24 bits: the high byte must not reach the responder resources
  req.responder_resources = 0;
  req.transport = static_cast<CmTransport>(0xFF);  // 2 bits
  req.remote_cm_response_timeout = 0;
  req.flow_control = false;
  req.path_mtu = 0x15;  // 4 bits
  req.rdc_exists = false;
  req.primary.flow_label = 0xFFF00001;  // 20 bits
  req.primary.packet_rate = 0;
  const Mad mad = EncodeWith(req);
  EXPECT_EQ(Be(mad, 56, 4), 0x00001100u);
  EXPECT_EQ(mad[67], 0x06);
  EXPECT_EQ(mad[74] & 0xF8, 0x50);
  EXPECT_EQ(Be(mad, 112, 4), 0x00001000u);
}

TEST(CmMad, RepBytesOfAnXrcTarget) {
  // An XRC target's REP: its QPN in Local EECN, SRQ set, local QPN, initiator depth and flow control 0.
  CmRep rep = FullRep();
  rep.local_qpn = 0;
  rep.local_eecn = 0x00BEEF;
  rep.initiator_depth = 0;
  rep.flow_control = false;
  rep.srq = true;
  const Mad mad = EncodeWith(rep);
  EXPECT_EQ(Be(mad, 24, 4), 0xCAFE0001u);
  EXPECT_EQ(Be(mad, 28, 4), 0x1234ABCDu);
  EXPECT_EQ(Be(mad, 32, 4), 0x0BADF00Du);
  EXPECT_EQ(Be(mad, 36, 3), 0u);         // local QPN
  EXPECT_EQ(mad[39], 0xA1);              // vendor ID high
  EXPECT_EQ(Be(mad, 40, 3), 0x00BEEFu);  // local EECN = the XRC target QPN
  EXPECT_EQ(mad[43], 0xB2);              // vendor ID middle
  EXPECT_EQ(Be(mad, 44, 3), 0x123456u);  // starting PSN
  EXPECT_EQ(mad[47], 0xC3);              // vendor ID low
  EXPECT_EQ(mad[48], 4);                 // responder resources
  EXPECT_EQ(mad[49], 0);                 // initiator depth
  EXPECT_EQ(mad[50], (15 << 3) | (2 << 1));  // target ACK delay, failover accepted, no flow control
  EXPECT_EQ(mad[51], (7 << 5) | 0x10);       // RNR retry count, SRQ
  EXPECT_EQ(Be(mad, 52, 8), 0x1122334455667788u);
  ExpectRange(mad, 60, rep.private_data.data(), kRepPrivateDataSize, "private data");
  auto parsed = ParseCmMad(mad);
  ASSERT_TRUE(parsed.has_value());
  const CmRep& back = std::get<CmRep>(parsed->message);
  EXPECT_EQ(back.local_eecn, 0x00BEEFu);
  EXPECT_EQ(back.vendor_id, 0xA1B2C3u);
  EXPECT_TRUE(back.srq);
}

TEST(CmMad, SidrRepBytes) {
  const CmSidrRep rep = FullSidrRep();
  const Mad mad = EncodeWith(rep);
  EXPECT_EQ(Be(mad, 24, 4), 0x5151AAAAu);
  EXPECT_EQ(mad[28], 4);   // status REDIRECT
  EXPECT_EQ(mad[29], 72);  // additional info length
  EXPECT_EQ(Be(mad, 30, 2), 0xD1E2u);  // vendor ID high 16
  EXPECT_EQ(Be(mad, 32, 3), 0x00ABCDu);  // QPN
  EXPECT_EQ(mad[35], 0xF3);              // vendor ID low 8
  EXPECT_EQ(Be(mad, 36, 8), 0x0000000001111C06u);  // service ID (udaddy's 7174 over UDP)
  EXPECT_EQ(Be(mad, 44, 4), 0x01234567u);
  ExpectRange(mad, 48, rep.additional_info.data(), kSidrRepAdditionalInfoSize, "additional info");
  ExpectRange(mad, 120, rep.private_data.data(), kSidrRepPrivateDataSize, "private data");
}

// Big-endian `size` bytes at MAD byte `offset` hold `value`.
struct FieldWant {
  size_t offset;
  size_t size;
  uint64_t value;
};

TEST(CmMad, SmallerMessagesBytes) {
  struct MessageWant {
    size_t index;  // in EveryMessage()
    std::vector<FieldWant> fields;
    size_t private_data_at;
  };
  const std::vector<MessageWant> wants = {
      {1, {{24, 4, 0x11111111}, {28, 4, 0x22222222}, {32, 1, 2 << 6} /* MRAed: other */, {33, 1, 24 << 3}}, 34},
      {2,
       {{24, 4, 0x33333333}, {28, 4, 0x44444444}, {32, 1, 1 << 6} /* rejected: REP */, {33, 1, 0x7F << 1},
        {34, 2, 28}, {36, 1, 0xA0} /* ARI's first byte */, {107, 1, 0xA0 + 71} /* and last */},
       108},
      {4, {{24, 8, 0x5555555566666666}}, 32},
      {5, {{24, 8, 0x7777777788888888}, {32, 4, 0xFEDCBA00} /* remote QPN, reserved byte */}, 36},
      {6, {{24, 8, 0x99999999AAAAAAAA}}, 32},
      {7, {{24, 4, 0xBBBBBBBB}, {28, 4, 0x7FFF0000} /* P_Key, reserved */, {32, 8, 0x0000000001111C06}}, 40},
  };
  const std::vector<CmMessage> all = EveryMessage();
  for (const MessageWant& want : wants) {
    const CmMessage& message = all[want.index];
    SCOPED_TRACE(std::string(ToString(AttributeOf(message))));
    const Mad mad = EncodeWith(message);
    for (const FieldWant& f : want.fields) EXPECT_EQ(Be(mad, f.offset, f.size), f.value) << "MAD byte " << f.offset;
    std::visit(
        [&](const auto& m) {
          EXPECT_EQ(want.private_data_at + m.private_data.size(), kMadSize);
          ExpectRange(mad, want.private_data_at, m.private_data.data(), m.private_data.size(), "private data");
        },
        message);
  }
}

TEST(CmMad, DefaultsEncodeAsTheKernelExpects) {
  // A default REQ: P_Key 0xFFFF, everything else zero, private data zero-filled.
  const Mad mad = EncodeWith(CmReq{}, 0);
  EXPECT_EQ(Be(mad, 72, 2), 0xFFFFu);
  for (size_t i = kMadHeaderSize; i < kMadSize; ++i) {
    if (i != 72 && i != 73) ASSERT_EQ(mad[i], 0) << "MAD byte " << i;
  }
  EXPECT_EQ(Be(EncodeWith(CmSidrReq{}), 28, 2), 0xFFFFu);
}

Mad Corrupted(size_t offset, uint8_t value) {
  Mad mad = EncodeWith(CmDreq{.remote_qpn = 0x11});
  mad[offset] = value;
  return mad;
}

TEST(CmMad, EveryParseError) {
  const Mad good = EncodeWith(CmDreq{.remote_qpn = 0x11});
  ASSERT_TRUE(ParseCmMad(good).has_value());
  // Longer input (a padded datagram) is fine: the MAD is its first 256 bytes.
  std::vector<uint8_t> longer(good.begin(), good.end());
  longer.resize(300, 0xEE);
  EXPECT_TRUE(ParseCmMad(longer).has_value());

  EXPECT_EQ(ParseCmMad(std::span<const uint8_t>(good).first(kMadSize - 1)).error(), MadError::kTruncated);
  EXPECT_EQ(ParseCmMad({}).error(), MadError::kTruncated);
  EXPECT_EQ(ParseCmMad(Corrupted(0, 2)).error(), MadError::kBadBaseVersion);
  EXPECT_EQ(ParseCmMad(Corrupted(1, 0x04)).error(), MadError::kNotCm);  // PerfMgmt
  EXPECT_EQ(ParseCmMad(Corrupted(2, 1)).error(), MadError::kBadClassVersion);
  EXPECT_EQ(ParseCmMad(Corrupted(3, 0x01)).error(), MadError::kBadMethod);  // GET
  EXPECT_EQ(ParseCmMad(Corrupted(3, 0x83)).error(), MadError::kBadMethod);  // response bit set
  for (uint16_t attribute : {0x0001, 0x0019, 0x001A, 0x0000, 0x001B, 0x1234}) {
    Mad mad = good;
    mad[16] = static_cast<uint8_t>(attribute >> 8);
    mad[17] = static_cast<uint8_t>(attribute);
    auto parsed = ParseCmMad(mad);
    ASSERT_FALSE(parsed.has_value()) << attribute;
    EXPECT_EQ(parsed.error(), MadError::kUnsupportedAttribute) << attribute;
  }

  std::set<std::string_view> names;
  for (MadError e : {MadError::kTruncated, MadError::kBadBaseVersion, MadError::kNotCm, MadError::kBadClassVersion,
                     MadError::kBadMethod, MadError::kUnsupportedAttribute}) {
    EXPECT_NE(ToString(e), "?");
    names.insert(ToString(e));
  }
  EXPECT_EQ(names.size(), 6u);
}

TEST(CmMad, AttributeNames) {
  const std::vector<std::pair<uint16_t, std::string_view>> names = {
      {0x0001, "ClassPortInfo"}, {0x0010, "REQ"},      {0x0011, "MRA"},      {0x0012, "REJ"},
      {0x0013, "REP"},           {0x0014, "RTU"},      {0x0015, "DREQ"},     {0x0016, "DREP"},
      {0x0017, "SIDR_REQ"},      {0x0018, "SIDR_REP"}, {0x0019, "LAP"},      {0x001A, "APR"},
      {0x1234, "ATTR_0x1234"},   {0xBEEF, "ATTR_0xbeef"},
  };
  for (const auto& [id, name] : names) EXPECT_EQ(ToString(static_cast<CmAttribute>(id)), name);
}

TEST(CmMad, RejectReasonAndSidrStatusNames) {
  // The reasons rdmacm.md 4.6 lists, in the kernel's words, and the edges of table 109.
  EXPECT_EQ(ToString(CmRejectReason::kNoQp), "NO_QP");
  EXPECT_EQ(ToString(CmRejectReason::kTimeout), "TIMEOUT");
  EXPECT_EQ(ToString(CmRejectReason::kInvalidServiceId), "INVALID_SERVICE_ID");
  EXPECT_EQ(ToString(CmRejectReason::kStaleConnection), "STALE_CONN");
  EXPECT_EQ(ToString(CmRejectReason::kInvalidGid), "INVALID_GID");
  EXPECT_EQ(ToString(CmRejectReason::kConsumerDefined), "CONSUMER_DEFINED");
  EXPECT_EQ(ToString(CmRejectReason::kVendorOptionNotSupported), "VENDOR_OPTION_NOT_SUPPORTED");
  EXPECT_EQ(ToString(static_cast<CmRejectReason>(33)), "INVALID_ALT_FLOW_LABEL");
  for (uint16_t reserved : {0, 34, 36, 0xFFFF}) EXPECT_EQ(ToString(static_cast<CmRejectReason>(reserved)), "reserved");
  EXPECT_EQ(ToString(SidrStatus::kSuccess), "SUCCESS");
  EXPECT_EQ(ToString(SidrStatus::kUnsupported), "UNSUPPORTED");
  EXPECT_EQ(ToString(SidrStatus::kUnsupportedVersion), "UNSUPPORTED_VERSION");
  EXPECT_EQ(ToString(static_cast<SidrStatus>(6)), "reserved");
}

TEST(CmMad, ServiceIds) {
  EXPECT_EQ(ServiceIdOf(kPortSpaceTcp, 7174), 0x0000000001061C06u);  // rping
  EXPECT_EQ(ServiceIdOf(kPortSpaceTcp, 7471), 0x0000000001061D2Fu);  // ucmatose
  EXPECT_EQ(ServiceIdOf(kPortSpaceUdp, 7174), 0x0000000001111C06u);  // udaddy
  EXPECT_EQ(ServiceIdOf(kPortSpaceIb, 7471), 0x00000000013F1D2Fu);
  EXPECT_EQ(PortSpaceOf(0x0000000001061C06), kPortSpaceTcp);
  EXPECT_EQ(PortOf(0x0000000001061C06), 7174);
  EXPECT_EQ(CmTimeoutMs(20), 4096u);
  EXPECT_EQ(CmTimeoutMs(3), 1u);
}

TEST(CmaHeader, Ipv4Bytes) {
  const CmaHeader h{.src_port = 45678,
                    .src = *IpAddress::Parse("127.0.0.2"),
                    .dst = *IpAddress::Parse("127.0.0.1")};
  const std::array<uint8_t, kCmaHeaderSize> bytes = EncodeCmaHeader(h);
  const std::array<uint8_t, kCmaHeaderSize> want = {
      0x00, 0x40, 0xB2, 0x6E,                                                  // version, IPv4, port 45678
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 0x00, 0x00, 0x02,              // source, zeros before
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 0x00, 0x00, 0x01};             // destination
  EXPECT_EQ(bytes, want);
  EXPECT_EQ(ParseCmaHeader(bytes), h);
}

TEST(CmaHeader, Ipv6Bytes) {
  const CmaHeader h{.src_port = 0x1234,
                    .src = *IpAddress::Parse("2001:db8::1"),
                    .dst = *IpAddress::Parse("2001:db8::2")};
  const std::array<uint8_t, kCmaHeaderSize> bytes = EncodeCmaHeader(h);
  EXPECT_EQ(bytes[0], 0x00);
  EXPECT_EQ(bytes[1], 0x60);
  EXPECT_EQ(bytes[2], 0x12);
  EXPECT_EQ(bytes[3], 0x34);
  EXPECT_TRUE(std::equal(h.src.bytes().begin(), h.src.bytes().end(), bytes.begin() + 4));
  EXPECT_TRUE(std::equal(h.dst.bytes().begin(), h.dst.bytes().end(), bytes.begin() + 20));
  EXPECT_EQ(ParseCmaHeader(bytes), h);
}

TEST(CmaHeader, InARequestsPrivateData) {
  // The cma_hdr opens the REQ's private data (MAD byte 164); user data follows at 164 + 36.
  CmReq req;
  const CmaHeader h{.src_port = 45678, .src = IpAddress::V4(0x0A000001), .dst = IpAddress::V4(0x0A000002)};
  const auto cma = EncodeCmaHeader(h);
  std::copy(cma.begin(), cma.end(), req.private_data.begin());
  req.private_data[kCmaHeaderSize] = 0x99;
  const Mad mad = EncodeWith(req);
  EXPECT_EQ(mad[164], 0x00);
  EXPECT_EQ(mad[165], 0x40);
  EXPECT_EQ(Be(mad, 166, 2), 45678u);
  EXPECT_EQ(Be(mad, 180, 4), 0x0A000001u);
  EXPECT_EQ(Be(mad, 196, 4), 0x0A000002u);
  EXPECT_EQ(mad[200], 0x99);
  auto parsed = ParseCmMad(mad);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(ParseCmaHeader(std::get<CmReq>(parsed->message).private_data), h);
}

TEST(CmaHeader, Rejects) {
  const auto good = EncodeCmaHeader({.src_port = 1, .src = IpAddress::V4(1), .dst = IpAddress::V4(2)});
  EXPECT_TRUE(ParseCmaHeader(good).has_value());
  EXPECT_EQ(ParseCmaHeader(std::span<const uint8_t>(good).first(kCmaHeaderSize - 1)), std::nullopt);
  auto bad_version = good;
  bad_version[0] = 1;
  EXPECT_EQ(ParseCmaHeader(bad_version), std::nullopt);
  for (uint8_t ip_version : {0x00, 0x50, 0xF0}) {
    auto bad = good;
    bad[1] = ip_version;
    EXPECT_EQ(ParseCmaHeader(bad), std::nullopt) << int(ip_version);
  }
  // The low nibble of byte 1 is reserved: ignored.
  auto reserved = good;
  reserved[1] = 0x4F;
  EXPECT_TRUE(ParseCmaHeader(reserved).has_value());
  // AF_IB private data (no cma_hdr): all zero.
  const std::array<uint8_t, kReqPrivateDataSize> zeros{};
  EXPECT_EQ(ParseCmaHeader(zeros), std::nullopt);
}

}  // namespace
}  // namespace uroce::wire
