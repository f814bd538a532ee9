#include "tools/decode_format.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "wire/cm_mad.h"
#include "wire/frame.h"
#include "wire/icrc.h"
#include "wire/packet.h"

namespace uroce::tools {
namespace {

using Bytes = std::vector<uint8_t>;
using wire::PacketSpec;

constexpr uint64_t kTs = 1'700'000'000'000'000'100ull;

wire::Flow V4Flow() {
  return wire::Flow{.src = {.addr = *wire::IpAddress::Parse("10.0.0.1"), .port = 0xC001},
                    .dst = {.addr = *wire::IpAddress::Parse("10.0.0.2"), .port = wire::kRoceV2UdpPort},
                    .ip_id = 0};
}

// The IP packet carrying `spec` + `payload` in `flow`, ICRC sealed (or left zero).
Bytes Frame(const wire::Flow& flow, const PacketSpec& spec, std::span<const uint8_t> payload, bool seal = true) {
  Bytes udp(wire::EncodedLength(spec, payload.size()));
  auto n = wire::EncodePacket(spec, payload, udp);
  EXPECT_TRUE(n.has_value());
  if (seal) wire::SealIcrc(flow, udp);
  const bool v6 = !(flow.src.addr.is_v4() && flow.dst.addr.is_v4());
  Bytes ip(wire::IpUdpFrameLength(v6, udp.size()));
  EXPECT_NE(wire::BuildIpUdpFrame(flow, udp, ip), 0u);
  return ip;
}

// The same with `payload_len` bytes of 0x5A as payload.
Bytes Frame(const wire::Flow& flow, const PacketSpec& spec, size_t payload_len, bool seal = true) {
  return Frame(flow, spec, Bytes(payload_len, 0x5A), seal);
}

// The ICRC of a frame in V4Flow(), in decimal as the JSON format prints it.
std::string IcrcOf(const Bytes& frame) {
  auto parsed = wire::ParseIpUdpFrame(frame);
  EXPECT_TRUE(parsed.has_value());
  return parsed ? std::to_string(wire::ComputeIcrc(V4Flow(), parsed->udp_payload)) : "";
}

PacketSpec Spec(uint8_t opcode, uint32_t qpn, uint32_t psn) {
  PacketSpec spec;
  spec.bth.opcode = opcode;
  spec.bth.dest_qp = qpn;
  spec.bth.psn = psn;
  return spec;
}

TEST(DecodeFormat, TextGoldenLines) {
  PacketDecoder decoder(DecodeFormat::kText);

  PacketSpec write_first = Spec(wire::opcode::kRcRdmaWriteFirst, 0x11, 100);
  write_first.reth = wire::Reth{.va = 0x7f0012345000, .rkey = 0x1234, .dma_length = 4096};
  EXPECT_EQ(decoder.DecodeIp(1, kTs, Frame(V4Flow(), write_first, 1024)),
            "#1 1700000000.000000100 10.0.0.1:49153 > 10.0.0.2:4791 RC_RDMA_WRITE_FIRST qp=0x000011 psn=0x000064 "
            "se=0 mig=0 ackreq=0 pad=0 pkey=0xffff reth{va=0x7f0012345000 rkey=0x00001234 len=4096} payload=1024 "
            "icrc=ok");

  PacketSpec ack = Spec(wire::opcode::kRcAcknowledge, 0x12, 0xFFFFFF);
  ack.aeth = wire::Aeth::Ack(5, 17);
  EXPECT_EQ(decoder.DecodeIp(2, kTs + 1, Frame(V4Flow(), ack, 0)),
            "#2 1700000000.000000101 10.0.0.1:49153 > 10.0.0.2:4791 RC_ACKNOWLEDGE qp=0x000012 psn=0xffffff "
            "se=0 mig=0 ackreq=0 pad=0 pkey=0xffff aeth{ACK credits=5 msn=17} payload=0 icrc=ok");

  PacketSpec rnr = Spec(wire::opcode::kRcAcknowledge, 0x12, 3);
  rnr.aeth = wire::Aeth::RnrNak(14, 3);
  EXPECT_EQ(decoder.DecodeIp(3, kTs, Frame(V4Flow(), rnr, 0)).value_or(""),
            "#3 1700000000.000000100 10.0.0.1:49153 > 10.0.0.2:4791 RC_ACKNOWLEDGE qp=0x000012 psn=0x000003 "
            "se=0 mig=0 ackreq=0 pad=0 pkey=0xffff aeth{RNR NAK timer=14 (1.28 ms) msn=3} payload=0 icrc=ok");

  // UD send with immediate over IPv6, SE set, 3 bytes of payload (1 pad byte).
  const wire::Flow v6{.src = {.addr = *wire::IpAddress::Parse("fe80::1"), .port = 0xC002},
                      .dst = {.addr = *wire::IpAddress::Parse("fe80::2"), .port = wire::kRoceV2UdpPort}};
  PacketSpec ud = Spec(wire::opcode::kUdSendOnlyWithImmediate, 0x000001, 7);
  ud.bth.solicited = true;
  ud.bth.pkey = 0x8001;
  ud.deth = wire::Deth{.qkey = 0x11111111, .src_qp = 0x000abc};
  const uint8_t imm_bytes[4] = {0xDE, 0xAD, 0xBE, 0xEF};
  ud.imm = wire::ImmDt::Decode(imm_bytes);
  EXPECT_EQ(decoder.DecodeIp(4, kTs, Frame(v6, ud, 3)).value_or(""),
            "#4 1700000000.000000100 [fe80::1]:49154 > [fe80::2]:4791 UD_SEND_ONLY_WITH_IMMEDIATE qp=0x000001 "
            "psn=0x000007 se=1 mig=0 ackreq=0 pad=1 pkey=0x8001 deth{qkey=0x11111111 src_qp=0x000abc} "
            "imm=0xdeadbeef payload=3 icrc=ok");

  // XRC compare-and-swap with a bad (unsealed) ICRC.
  PacketSpec cas = Spec(0xA0 | 0x13, 0x42, 9);
  cas.bth.ack_req = true;
  cas.xrc = wire::XrcEth{.srqn = 0x55};
  cas.atomic = wire::AtomicEth{.va = 0x1000, .rkey = 0xabcd, .swap_add = 2, .compare = 1};
  const Bytes cas_frame = Frame(V4Flow(), cas, 0, /*seal=*/false);
  auto parsed = wire::ParseIpUdpFrame(cas_frame);
  ASSERT_TRUE(parsed.has_value());
  char want[16];
  std::snprintf(want, sizeof want, "0x%08x", wire::ComputeIcrc(V4Flow(), parsed->udp_payload));
  EXPECT_EQ(decoder.DecodeIp(5, kTs, cas_frame).value_or(""),
            "#5 1700000000.000000100 10.0.0.1:49153 > 10.0.0.2:4791 XRC_COMPARE_SWAP qp=0x000042 psn=0x000009 "
            "se=0 mig=0 ackreq=1 pad=0 pkey=0xffff xrceth{srqn=0x000055} atomiceth{va=0x1000 rkey=0x0000abcd "
            "swap_add=0x2 compare=0x1} payload=0 icrc=bad (got 0x00000000, want " +
                std::string(want) + ")");

  PacketSpec atomic_ack = Spec(wire::opcode::kRcAtomicAcknowledge, 0x13, 9);
  atomic_ack.aeth = wire::Aeth::Nak(wire::NakCode::kRemoteAccessError, 4);
  atomic_ack.atomic_ack = wire::AtomicAckEth{.original = 0xfeedface};
  EXPECT_EQ(decoder.DecodeIp(6, kTs, Frame(V4Flow(), atomic_ack, 0)).value_or(""),
            "#6 1700000000.000000100 10.0.0.1:49153 > 10.0.0.2:4791 RC_ATOMIC_ACKNOWLEDGE qp=0x000013 "
            "psn=0x000009 se=0 mig=0 ackreq=0 pad=0 pkey=0xffff aeth{NAK remote access error (code 2) msn=4} "
            "atomicacketh{original=0xfeedface} payload=0 icrc=ok");

  PacketSpec inval = Spec(wire::opcode::kRcSendOnlyWithInvalidate, 0x14, 1);
  inval.ieth = wire::Ieth{.rkey = 0x77};
  inval.bth.mig_req = true;
  inval.bth.fecn = true;
  EXPECT_EQ(decoder.DecodeIp(7, kTs, Frame(V4Flow(), inval, 8)).value_or(""),
            "#7 1700000000.000000100 10.0.0.1:49153 > 10.0.0.2:4791 RC_SEND_ONLY_WITH_INVALIDATE qp=0x000014 "
            "psn=0x000001 se=0 mig=1 ackreq=0 pad=0 pkey=0xffff FECN ieth{rkey=0x00000077} payload=8 icrc=ok");

  EXPECT_EQ(decoder.counts().roce, 7u);
  EXPECT_EQ(decoder.counts().icrc_bad, 1u);
  EXPECT_EQ(decoder.Summary(), "7 packets, 7 RoCE, 0 skipped (not RoCEv2), 0 malformed, 1 ICRC bad");
}

TEST(DecodeFormat, JsonGoldenLine) {
  PacketDecoder decoder(DecodeFormat::kJson);
  PacketSpec read = Spec(wire::opcode::kRcRdmaReadRequest, 0x11, 100);
  read.bth.ack_req = true;
  read.reth = wire::Reth{.va = 0x1000, .rkey = 0x20, .dma_length = 65536};
  const Bytes frame = Frame(V4Flow(), read, 0);
  const std::string icrc = IcrcOf(frame);
  EXPECT_EQ(decoder.DecodeIp(1, kTs, frame).value_or(""),
            "{\"index\":1,\"ts\":1700000000.000000100,\"ts_ns\":1700000000000000100,\"src\":\"10.0.0.1:49153\","
            "\"dst\":\"10.0.0.2:4791\",\"opcode\":12,\"opcode_name\":\"RC_RDMA_READ_REQUEST\",\"transport\":\"RC\","
            "\"dest_qp\":17,\"psn\":100,\"se\":false,\"mig_req\":false,\"ack_req\":true,\"pad\":0,\"pkey\":65535,"
            "\"tver\":0,\"fecn\":false,\"becn\":false,\"reth\":{\"va\":4096,\"rkey\":32,\"len\":65536},"
            "\"payload_len\":0,\"icrc\":" + icrc + ",\"icrc_want\":" + icrc + ",\"icrc_ok\":true}");
}

TEST(DecodeFormat, SkipsWhatIsNotRoceV2AndReportsWhatIsBroken) {
  PacketDecoder decoder(DecodeFormat::kText);
  // UDP to another port: skipped.
  wire::Flow other = V4Flow();
  other.dst.port = 53;
  EXPECT_EQ(decoder.DecodeIp(1, kTs, Frame(other, Spec(wire::opcode::kRcSendOnly, 1, 1), 4)), std::nullopt);
  // A TCP packet: skipped.
  Bytes tcp = Frame(V4Flow(), Spec(wire::opcode::kRcSendOnly, 1, 1), 4);
  tcp[9] = 6;
  EXPECT_EQ(decoder.DecodeIp(2, kTs, tcp), std::nullopt);
  // Unknown opcode 0x1f on port 4791: malformed, with the addresses.
  Bytes unknown = Frame(V4Flow(), Spec(wire::opcode::kRcSendOnly, 1, 1), 4);
  unknown[28] = 0x1F;
  EXPECT_EQ(decoder.DecodeIp(3, kTs, unknown).value_or(""),
            "#3 1700000000.000000100 10.0.0.1:49153 > 10.0.0.2:4791 malformed: " +
                std::string(wire::ToString(wire::ParseError::kUnknownOpcode)) + " (opcode 0x1f)");
  // Cut by snaplen inside the BTH: the IP/UDP lengths no longer fit.
  Bytes cut = Frame(V4Flow(), Spec(wire::opcode::kRcSendOnly, 1, 1), 64);
  const size_t original = cut.size();
  cut.resize(34);
  auto line = decoder.DecodeIp(4, kTs, cut, static_cast<uint32_t>(original));
  ASSERT_TRUE(line.has_value());
  EXPECT_NE(line->find("#4 1700000000.000000100 malformed: IP/UDP "), std::string::npos) << *line;
  EXPECT_NE(line->find("(capture cut at 34 bytes by snaplen; " + std::to_string(original) + " on the wire)"),
            std::string::npos)
      << *line;
  // A record the pcap reader found broken at the link layer.
  wire::PcapRecord record;
  record.index = 5;
  record.timestamp_ns = kTs;
  record.not_ip = "frame too short for an Ethernet header (3 bytes)";
  record.malformed = true;
  EXPECT_EQ(decoder.Decode(record).value_or(""),
            "#5 1700000000.000000100 malformed: frame too short for an Ethernet header (3 bytes)");
  // ARP: skipped.
  record.index = 6;
  record.not_ip = "EtherType 0x0806 is not IP";
  record.malformed = false;
  EXPECT_EQ(decoder.Decode(record), std::nullopt);
  EXPECT_EQ(decoder.FileError(7, "record 7: file cut short inside the packet (3 of 90 bytes)"),
            "#7 malformed: record 7: file cut short inside the packet (3 of 90 bytes)");

  EXPECT_EQ(decoder.Summary(), "6 packets, 0 RoCE, 3 skipped (not RoCEv2), 4 malformed, 0 ICRC bad");
}

TEST(DecodeFormat, JsonStringEscapes) {
  EXPECT_EQ(JsonString("a\"b\\c\n\x01\xff"), "\"a\\\"b\\\\c\\n\\u0001\\u00ff\"");
}

// Every line the JSON format produces, for every opcode in the table and for malformed packets, parses as JSON
// with Python's json module (Debian's /usr/bin/python3) and carries the documented keys.
TEST(DecodeFormat, JsonLinesParseWithPython) {
  PacketDecoder decoder(DecodeFormat::kJson);
  std::vector<std::string> lines;
  uint64_t index = 1;
  for (const wire::OpcodeInfo& info : wire::AllOpcodes()) {
    PacketSpec spec = Spec(info.code, static_cast<uint32_t>(index * 3), static_cast<uint32_t>(index));
    spec.rdeth = wire::Rdeth{.eecn = 1};
    spec.deth = wire::Deth{.qkey = 2, .src_qp = 3};
    spec.xrc = wire::XrcEth{.srqn = 4};
    spec.reth = wire::Reth{.va = 0xFFFFFFFFFFFFFFFFull, .rkey = 5, .dma_length = 6};
    spec.atomic = wire::AtomicEth{.va = 7, .rkey = 8, .swap_add = 9, .compare = 10};
    spec.aeth = wire::Aeth::Nak(wire::NakCode::kInvalidRequest, 11);
    spec.atomic_ack = wire::AtomicAckEth{.original = 12};
    spec.imm = wire::ImmDt{.imm = 13};
    spec.ieth = wire::Ieth{.rkey = 14};
    const size_t payload = info.has_payload ? (info.fixed_payload != 0 ? info.fixed_payload : 5) : 0;
    auto line = decoder.DecodeIp(index++, kTs, Frame(V4Flow(), spec, payload));
    ASSERT_TRUE(line.has_value()) << info.name;
    lines.push_back(*line);
  }
  Bytes unknown = Frame(V4Flow(), Spec(wire::opcode::kRcSendOnly, 1, 1), 4);
  unknown[28] = 0x1F;
  lines.push_back(decoder.DecodeIp(index++, kTs, unknown).value());
  lines.push_back(decoder.FileError(index, "cut \"short\""));

  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/lines.jsonl";
  {
    std::ofstream out(path);
    for (const std::string& line : lines) out << line << "\n";
  }
  const std::string check =
      "/usr/bin/python3 -c '\n"
      "import json, sys\n"
      "n = 0\n"
      "for line in open(sys.argv[1]):\n"
      "    o = json.loads(line)\n"
      "    if \"malformed\" not in o:\n"
      "        for k in (\"index\", \"ts\", \"src\", \"dst\", \"opcode\", \"opcode_name\", \"dest_qp\", \"psn\",\n"
      "                  \"se\", \"mig_req\", \"ack_req\", \"pad\", \"pkey\", \"payload_len\", \"icrc_ok\"):\n"
      "            assert k in o, (k, line)\n"
      "        assert o[\"icrc_ok\"] is True, line\n"
      "        assert o[\"dest_qp\"] == o[\"index\"] * 3, line\n"
      "        if \"reth\" in o: assert o[\"reth\"][\"va\"] == 2**64 - 1, line\n"
      "        if \"aeth\" in o: assert o[\"aeth\"][\"kind\"] == \"NAK\" and o[\"aeth\"][\"nak_code\"] == 1, line\n"
      "    n += 1\n"
      "assert n == " +
      std::to_string(lines.size()) + "\n' " + path;
  EXPECT_EQ(std::system(check.c_str()), 0) << "python3 rejected " << path;
}

// --- CM MADs ---------------------------------------------------------------------------------------------------

// A CM MAD as the kernel sends it: UD SEND_ONLY to QP1 from QP1 with the GSI Q_Key, in V4Flow().
Bytes CmFrame(const wire::CmMessage& message) {
  PacketSpec spec = Spec(wire::opcode::kUdSendOnly, wire::kGsiQpn, 5);
  spec.deth = wire::Deth{.qkey = wire::kGsiQkey, .src_qp = wire::kGsiQpn};
  const auto mad = wire::EncodeCmMad({.transaction_id = 0x100000001, .message = message});
  return Frame(V4Flow(), spec, mad);
}

constexpr char kGsiPrefix[] =
    "#1 1700000000.000000100 10.0.0.1:49153 > 10.0.0.2:4791 UD_SEND_ONLY qp=0x000001 psn=0x000005 se=0 mig=0 "
    "ackreq=0 pad=0 pkey=0xffff deth{qkey=0x80010000 src_qp=0x000001} payload=256 icrc=ok";

wire::CmReq RpingReq() {
  wire::CmReq req;
  req.local_comm_id = 0x1234abcd;
  req.service_id = wire::ServiceIdOf(wire::kPortSpaceTcp, 7174);
  req.local_qpn = 0x11;
  req.starting_psn = 0xabcdef;
  const auto cma = wire::EncodeCmaHeader({.src_port = 45678, .src = V4Flow().src.addr, .dst = V4Flow().dst.addr});
  std::copy(cma.begin(), cma.end(), req.private_data.begin());
  return req;
}

TEST(DecodeFormat, CmMessagesAreNamedInText) {
  wire::CmRep xrc_rep{.local_comm_id = 0xcafe0001, .remote_comm_id = 0x1234abcd, .local_eecn = 0x33,
                      .starting_psn = 0x123456, .srq = true};
  wire::CmSidrReq sidr_req{.request_id = 0x51, .service_id = wire::ServiceIdOf(wire::kPortSpaceUdp, 7174)};
  const auto cma6 = wire::EncodeCmaHeader(
      {.src_port = 1, .src = *wire::IpAddress::Parse("2001:db8::1"), .dst = *wire::IpAddress::Parse("2001:db8::2")});
  std::copy(cma6.begin(), cma6.end(), sidr_req.private_data.begin());
  const std::vector<std::pair<wire::CmMessage, std::string>> cases = {
      {RpingReq(), " CM REQ comm=0x1234abcd sid=0x0000000001061c06 qpn=0x11 psn=0xabcdef cma 10.0.0.1:45678->10.0.0.2"},
      {wire::CmReq{.local_comm_id = 1, .service_id = 2, .local_qpn = 3, .starting_psn = 4},  // AF_IB: no cma_hdr
       " CM REQ comm=0x00000001 sid=0x0000000000000002 qpn=0x3 psn=0x4"},
      {wire::CmMra{.local_comm_id = 7, .remote_comm_id = 8, .service_timeout = 24},
       " CM MRA comm=0x00000007 remote=0x00000008 timeout=24"},
      {wire::CmRej{.remote_comm_id = 0x1234abcd, .reason = 8},
       " CM REJ comm=0x00000000 remote=0x1234abcd reason=8 (INVALID_SERVICE_ID)"},
      {wire::CmRep{.local_comm_id = 0xcafe0001, .remote_comm_id = 0x1234abcd, .local_qpn = 0x22,
                   .starting_psn = 0x123456},
       " CM REP comm=0xcafe0001 remote=0x1234abcd qpn=0x22 psn=0x123456"},
      {xrc_rep, " CM REP comm=0xcafe0001 remote=0x1234abcd qpn=0x0 eecn=0x33 psn=0x123456"},
      {wire::CmRtu{.local_comm_id = 0x1234abcd, .remote_comm_id = 0xcafe0001},
       " CM RTU comm=0x1234abcd remote=0xcafe0001"},
      {wire::CmDreq{.local_comm_id = 0x1234abcd, .remote_comm_id = 0xcafe0001, .remote_qpn = 0x22},
       " CM DREQ comm=0x1234abcd remote=0xcafe0001 remote_qpn=0x22"},
      {wire::CmDrep{.local_comm_id = 0xcafe0001, .remote_comm_id = 0x1234abcd},
       " CM DREP comm=0xcafe0001 remote=0x1234abcd"},
      {sidr_req, " CM SIDR_REQ req=0x00000051 sid=0x0000000001111c06 cma [2001:db8::1]:1->2001:db8::2"},
      {wire::CmSidrRep{.request_id = 0x51, .status = wire::SidrStatus::kUnsupported, .qpn = 0x99, .qkey = 0x01234567},
       " CM SIDR_REP req=0x00000051 status=1 (UNSUPPORTED) qpn=0x99 qkey=0x01234567"},
  };
  for (const auto& [message, cm] : cases) {
    PacketDecoder decoder(DecodeFormat::kText);
    EXPECT_EQ(decoder.DecodeIp(1, kTs, CmFrame(message)).value_or(""), kGsiPrefix + cm);
  }
}

TEST(DecodeFormat, CmMadsTheKernelWouldDropSayWhy) {
  PacketDecoder decoder(DecodeFormat::kText);
  PacketSpec spec = Spec(wire::opcode::kUdSendOnly, wire::kGsiQpn, 5);
  spec.deth = wire::Deth{.qkey = wire::kGsiQkey, .src_qp = wire::kGsiQpn};
  auto mad = wire::EncodeCmMad({.message = wire::CmRtu{}});
  mad[2] = 1;  // class version 1
  std::string line = decoder.DecodeIp(1, kTs, Frame(V4Flow(), spec, mad)).value_or("");
  EXPECT_NE(line.find("icrc=ok CM malformed: " + std::string(wire::ToString(wire::MadError::kBadClassVersion))),
            std::string::npos)
      << line;
  // Cut short: the kernel takes a MAD as 256 bytes.
  mad[2] = wire::kCmClassVersion;
  line = decoder.DecodeIp(2, kTs, Frame(V4Flow(), spec, std::span(mad).first(100))).value_or("");
  EXPECT_NE(line.find("payload=100 icrc=ok CM malformed: " + std::string(wire::ToString(wire::MadError::kTruncated))),
            std::string::npos)
      << line;
  // Another management class (subnet administration) to QP1, and a CM MAD to a QP other than 1: no CM part.
  mad[1] = 0x03;
  line = decoder.DecodeIp(3, kTs, Frame(V4Flow(), spec, mad)).value_or("");
  EXPECT_TRUE(line.ends_with("payload=256 icrc=ok")) << line;
  mad[1] = wire::kMgmtClassCm;
  spec.bth.dest_qp = 2;
  line = decoder.DecodeIp(4, kTs, Frame(V4Flow(), spec, mad)).value_or("");
  EXPECT_TRUE(line.ends_with("payload=256 icrc=ok")) << line;
}

TEST(DecodeFormat, CmMessagesInJson) {
  PacketDecoder decoder(DecodeFormat::kJson);
  const Bytes frame = CmFrame(RpingReq());
  const std::string icrc = IcrcOf(frame);
  EXPECT_EQ(decoder.DecodeIp(1, kTs, frame).value_or(""),
            "{\"index\":1,\"ts\":1700000000.000000100,\"ts_ns\":1700000000000000100,\"src\":\"10.0.0.1:49153\","
            "\"dst\":\"10.0.0.2:4791\",\"opcode\":100,\"opcode_name\":\"UD_SEND_ONLY\",\"transport\":\"UD\","
            "\"dest_qp\":1,\"psn\":5,\"se\":false,\"mig_req\":false,\"ack_req\":false,\"pad\":0,\"pkey\":65535,"
            "\"tver\":0,\"fecn\":false,\"becn\":false,\"deth\":{\"qkey\":2147549184,\"src_qp\":1},"
            "\"payload_len\":256,\"icrc\":" + icrc + ",\"icrc_want\":" + icrc + ",\"icrc_ok\":true,"
            "\"cm\":{\"message\":\"REQ\",\"comm\":305441741,\"sid\":17177606,\"qpn\":17,\"psn\":11259375,"
            "\"cma\":{\"src\":\"10.0.0.1\",\"src_port\":45678,\"dst\":\"10.0.0.2\"}}}");
  const std::string rej = decoder.DecodeIp(2, kTs, CmFrame(wire::CmRej{.remote_comm_id = 9, .reason = 28})).value();
  EXPECT_TRUE(rej.ends_with(",\"cm\":{\"message\":\"REJ\",\"comm\":0,\"remote\":9,\"reason\":28,"
                            "\"reason_name\":\"CONSUMER_DEFINED\"}}"))
      << rej;
  const std::string sidr =
      decoder.DecodeIp(3, kTs, CmFrame(wire::CmSidrRep{.request_id = 1, .qpn = 2, .qkey = 3})).value();
  EXPECT_TRUE(sidr.ends_with(",\"cm\":{\"message\":\"SIDR_REP\",\"req\":1,\"status\":0,\"status_name\":\"SUCCESS\","
                             "\"qpn\":2,\"qkey\":3}}"))
      << sidr;
}

// Captures dumpcap made of a plain UDP socket sending three RC SEND_ONLY packets (ICRC computed by scapy for IPv4
// ID 0, which Linux uses for DF datagrams from an unconnected IP_PMTUDISC_DO socket) and one 3-byte datagram to
// port 4791, with ICMP port-unreachable replies on `lo`. Read through PcapReader as uroce_decode does.
std::vector<std::string> DecodeFile(const std::string& path, PacketDecoder* decoder) {
  std::vector<std::string> lines;
  wire::PcapReader reader;
  EXPECT_EQ(reader.Open(path), 0) << reader.error();
  wire::PcapRecord record;
  int rc;
  while ((rc = reader.Next(&record)) == 1) {
    if (auto line = decoder->Decode(record)) lines.push_back(*line);
  }
  EXPECT_EQ(rc, 0) << reader.error();
  return lines;
}

TEST(DecodeFormat, RealLoopbackCaptures) {
  const std::vector<std::string> sends = {
      " 127.0.0.1:49551 > 127.0.0.1:4791 RC_SEND_ONLY qp=0x000011 psn=0x000064 se=0 mig=0 ackreq=0 pad=0 "
      "pkey=0xffff payload=8 icrc=ok",
      " 127.0.0.1:49551 > 127.0.0.1:4791 RC_SEND_ONLY qp=0x000012 psn=0x000065 se=0 mig=0 ackreq=0 pad=0 "
      "pkey=0xffff payload=8 icrc=ok",
      " 127.0.0.1:49551 > 127.0.0.1:4791 RC_SEND_ONLY qp=0x000013 psn=0x000066 se=0 mig=0 ackreq=0 pad=0 "
      "pkey=0xffff payload=8 icrc=ok",
      " 127.0.0.1:49551 > 127.0.0.1:4791 malformed: truncated (opcode 0x00)",
  };
  {
    PacketDecoder decoder(DecodeFormat::kText);
    const std::vector<std::string> lines = DecodeFile("wire/testdata/dumpcap_lo_rc_send.pcap", &decoder);
    ASSERT_EQ(lines.size(), 4u);
    EXPECT_EQ(lines[0], "#1 1795303322.751173000" + sends[0]);
    EXPECT_EQ(lines[1], "#3 1795303322.752595000" + sends[1]);
    EXPECT_EQ(lines[2], "#5 1795303322.753475000" + sends[2]);
    EXPECT_EQ(lines[3], "#7 1795303322.753480000" + sends[3]);
    EXPECT_EQ(decoder.Summary(), "8 packets, 3 RoCE, 4 skipped (not RoCEv2), 1 malformed, 0 ICRC bad");
  }
  {
    PacketDecoder decoder(DecodeFormat::kText);
    const std::vector<std::string> lines = DecodeFile("wire/testdata/dumpcap_any_sll_rc_send.pcap", &decoder);
    ASSERT_EQ(lines.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_NE(lines[i].find(sends[i]), std::string::npos) << lines[i];
    EXPECT_EQ(decoder.Summary(), "4 packets, 3 RoCE, 0 skipped (not RoCEv2), 1 malformed, 0 ICRC bad");
  }
}

}  // namespace
}  // namespace uroce::tools
