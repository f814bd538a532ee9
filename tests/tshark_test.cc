// Interoperability with Wireshark: a capture holding one packet of every opcode uroce knows, encoded by our codec
// and written by our pcap writer, must be read by Debian's tshark as RoCEv2 (InfiniBand BTH over UDP 4791) with the
// same opcode, destination QP and PSN -- and by our own `uroce_decode` with every ICRC good. This pins the byte
// layout of the BTH and the pcap file format against an independent implementation. The IB CM messages
// (wire/cm_mad.h) are checked the same way against Wireshark's CM dissector.
//
// tshark (Debian package tshark, installed by `tools/uroce setup`) must be on PATH; the opcode tests fail with a
// message saying so otherwise, the CM test skips.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "wire/cm_mad.h"
#include "wire/frame.h"
#include "wire/icrc.h"
#include "wire/packet.h"
#include "wire/pcap.h"

namespace uroce {
namespace {

using Bytes = std::vector<uint8_t>;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

struct Command {
  int status;
  std::string out;
};

// Runs a shell command; returns its exit status and standard output (stderr goes to `stderr_path`).
Command RunShell(const std::string& command, const std::string& stderr_path) {
  Command result{-1, ""};
  std::FILE* pipe = ::popen((command + " 2>" + stderr_path).c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) result.out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(text);
  while (std::getline(in, field, separator)) out.push_back(field);
  return out;
}

// What the capture holds, per frame number (1-based).
struct Sent {
  uint8_t opcode;
  uint32_t qpn;
  uint32_t psn;
  uint32_t icrc;
};

// The IP packet carrying `spec` + `payload` in `flow`, ICRC sealed (and returned in `icrc`).
Bytes SealedFrame(const wire::PacketSpec& spec, std::span<const uint8_t> payload, const wire::Flow& flow,
                  uint32_t* icrc) {
  Bytes udp(wire::EncodedLength(spec, payload.size()));
  auto n = wire::EncodePacket(spec, payload, udp);
  EXPECT_TRUE(n.has_value()) << "opcode " << int(spec.bth.opcode);
  wire::SealIcrc(flow, udp);
  *icrc = wire::ComputeIcrc(flow, udp);
  const bool v6 = !(flow.src.addr.is_v4() && flow.dst.addr.is_v4());
  Bytes ip(wire::IpUdpFrameLength(v6, udp.size()));
  EXPECT_NE(wire::BuildIpUdpFrame(flow, udp, ip), 0u);
  return ip;
}

// A packet of `info`'s opcode with every header it needs filled in with recognisable values, in `flow`, sealed.
Bytes BuildPacket(const wire::OpcodeInfo& info, uint32_t qpn, uint32_t psn, const wire::Flow& flow,
                  uint32_t* icrc) {
  wire::PacketSpec spec;
  spec.bth.opcode = info.code;
  spec.bth.dest_qp = qpn;
  spec.bth.psn = psn;
  spec.bth.ack_req = info.is_request && (info.position == wire::MsgPosition::kOnly ||
                                         info.position == wire::MsgPosition::kLast);
  spec.rdeth = wire::Rdeth{.eecn = 0x000123};
  spec.deth = wire::Deth{.qkey = 0x11111111, .src_qp = 0x000456};
  spec.xrc = wire::XrcEth{.srqn = 0x000789};
  spec.reth = wire::Reth{.va = 0x00007f0000001000, .rkey = 0xabcdef01, .dma_length = 4096};
  spec.atomic = wire::AtomicEth{.va = 0x2000, .rkey = 0x1234, .swap_add = 5, .compare = 6};
  spec.aeth = wire::Aeth::Ack(wire::kInvalidCredits, psn);
  spec.atomic_ack = wire::AtomicAckEth{.original = 0x0102030405060708};
  spec.imm = wire::ImmDt{.imm = 0x44332211};
  spec.ieth = wire::Ieth{.rkey = 0x5555};
  size_t payload_len = 0;
  if (info.has_payload) payload_len = info.fixed_payload != 0 ? info.fixed_payload : 1 + qpn % 61;
  Bytes payload(payload_len);
  for (size_t i = 0; i < payload_len; ++i) payload[i] = static_cast<uint8_t>(i * 7);
  return SealedFrame(spec, payload, flow, icrc);
}

// Writes one packet per opcode (IPv4 and IPv6 alternating; documentation addresses, RFC 5737 / RFC 3849) to a
// pcap file of `link_type` and returns what was written, by frame number.
std::map<int, Sent> WriteEveryOpcode(const std::string& path, wire::PcapLinkType link_type) {
  wire::PcapWriter writer;
  EXPECT_EQ(writer.Open(path, {.link_type = link_type}), 0);
  const wire::Flow v4{.src = {.addr = *wire::IpAddress::Parse("192.0.2.1"), .port = 0xC123},
                      .dst = {.addr = *wire::IpAddress::Parse("198.51.100.2"), .port = wire::kRoceV2UdpPort}};
  const wire::Flow v6{.src = {.addr = *wire::IpAddress::Parse("2001:db8::1"), .port = 0xD456},
                      .dst = {.addr = *wire::IpAddress::Parse("2001:db8::2"), .port = wire::kRoceV2UdpPort}};
  std::map<int, Sent> sent;
  int frame = 0;
  for (const wire::OpcodeInfo& info : wire::AllOpcodes()) {
    ++frame;
    const uint32_t qpn = (0x000011 + 0x010203u * frame) & wire::kMask24;
    const uint32_t psn = (0xFFFFF0u + 0x0A0B0Cu * frame) & wire::kMask24;
    Sent s{info.code, qpn, psn, 0};
    const Bytes ip = BuildPacket(info, qpn, psn, frame % 2 == 0 ? v6 : v4, &s.icrc);
    EXPECT_EQ(writer.Write(1'700'000'000'000'000'000ull + frame * 1000ull, ip), 0);
    sent[frame] = s;
  }
  EXPECT_EQ(writer.Close(), 0);
  return sent;
}

bool HaveTshark() { return std::system("command -v tshark >/dev/null 2>&1") == 0; }

void CheckTsharkReads(const std::string& path, const std::map<int, Sent>& sent) {
  ASSERT_TRUE(HaveTshark()) << "tshark is not installed: run `tools/uroce setup` (Debian package tshark)";
  const std::string err = path + ".tshark.err";
  // RoCEv2 on UDP 4791 is decoded by default (tshark -G decodes lists udp.port 4791 -> infiniband); the -d makes it
  // explicit so a changed default cannot make the test vacuous.
  const Command tshark = RunShell("tshark -n -r " + path +
                                 " -d udp.port==4791,infiniband -T fields -E separator=/t -E occurrence=f"
                                 " -e frame.number -e udp.dstport -e infiniband.bth.opcode"
                                 " -e infiniband.bth.destqp -e infiniband.bth.psn -e infiniband.invariant.crc"
                                 " -e _ws.malformed -e _ws.expert.severity",
                             err);
  ASSERT_EQ(tshark.status, 0) << "tshark failed: " << ReadText(err);
  const std::vector<std::string> lines = Split(tshark.out, '\n');
  ASSERT_EQ(lines.size(), sent.size()) << tshark.out << ReadText(err);
  size_t checked_icrc = 0;
  size_t exempt = 0;
  for (const std::string& line : lines) {
    const std::vector<std::string> f = Split(line, '\t');
    ASSERT_GE(f.size(), 6u) << line;
    const int frame = std::stoi(f[0]);
    const Sent& s = sent.at(frame);
    SCOPED_TRACE(testing::Message() << "frame " << frame << " opcode " << int(s.opcode) << ": " << line);
    EXPECT_EQ(f[1], "4791");
    ASSERT_FALSE(f[2].empty()) << "tshark did not decode an InfiniBand BTH";
    EXPECT_EQ(std::stoul(f[2], nullptr, 0), s.opcode);
    EXPECT_EQ(std::stoul(f[3], nullptr, 0), s.qpn);
    EXPECT_EQ(std::stoul(f[4], nullptr, 0), s.psn);
    // Wireshark 4.0 misplaces the extension headers of Reliable Datagram packets (it reads RDETH 8 bytes after
    // the BTH, so READ requests, atomics and atomic ACKs overrun the packet and are flagged malformed), although
    // its header table agrees with IBTA 9.2 and ours; RD has no RoCE implementation to settle it, so only the BTH
    // of RD packets is compared.
    const uint8_t transport = s.opcode & 0xE0;
    if (transport == wire::opcode::kRdBase) {
      ++exempt;
      continue;
    }
    if (f.size() > 6) EXPECT_EQ(f[6], "") << "tshark flagged the packet as malformed";
    // Wireshark 4.0 names the XRC opcodes but shows everything after their BTH as unknown data, and knows the CNP
    // as opcode 0x80 rather than 0x81 (IBTA A17.9.2): for those it finds no ICRC.
    if (transport == wire::opcode::kXrcBase || s.opcode == wire::opcode::kCnp) {
      ++exempt;
      continue;
    }
    // tshark 4.0 shows the ICRC but does not verify it (it has no ICRC status field); it must at least find it
    // where we put it. The field is the 4 trailing bytes read in network order; we store the CRC least significant
    // byte first (icrc.h).
    ASSERT_FALSE(f[5].empty()) << "tshark found no ICRC";
    EXPECT_EQ(std::stoul(f[5], nullptr, 0), __builtin_bswap32(s.icrc));
    ++checked_icrc;
  }
  EXPECT_EQ(checked_icrc + exempt, sent.size());
  EXPECT_EQ(checked_icrc, 37u);  // every RC (23), UC (12) and UD (2) opcode
}

TEST(Tshark, ReadsEveryOpcodeFromARawIpCapture) {
  const std::string path = TempPath("every_opcode_raw.pcap");
  const std::map<int, Sent> sent = WriteEveryOpcode(path, wire::PcapLinkType::kRaw);
  ASSERT_EQ(sent.size(), wire::AllOpcodes().size());
  CheckTsharkReads(path, sent);
}

TEST(Tshark, ReadsEveryOpcodeFromAnEthernetCapture) {
  const std::string path = TempPath("every_opcode_eth.pcap");
  const std::map<int, Sent> sent = WriteEveryOpcode(path, wire::PcapLinkType::kEthernet);
  CheckTsharkReads(path, sent);
}

// A capture rewritten by tshark itself (as pcap, microsecond timestamps, Ethernet link type) decodes with our
// uroce_decode: every packet RoCE, every ICRC good, opcodes and QPNs as written.
TEST(Tshark, UroceDecodeReadsWhatTsharkWrites) {
  ASSERT_TRUE(HaveTshark()) << "tshark is not installed: run `tools/uroce setup` (Debian package tshark)";
  const std::string original = TempPath("decode_in.pcap");
  const std::map<int, Sent> sent = WriteEveryOpcode(original, wire::PcapLinkType::kEthernet);
  const std::string rewritten = TempPath("decode_tshark.pcap");
  const std::string err = TempPath("decode.err");
  const Command rewrite = RunShell("tshark -r " + original + " -F pcap -w " + rewritten, err);
  ASSERT_EQ(rewrite.status, 0) << ReadText(err);

  const Command decode = RunShell("tools/uroce_decode " + rewritten + " --json", err);
  ASSERT_EQ(decode.status, 0) << ReadText(err);
  const std::vector<std::string> lines = Split(decode.out, '\n');
  ASSERT_EQ(lines.size(), sent.size()) << decode.out;
  for (const std::string& line : lines) {
    EXPECT_NE(line.find("\"icrc_ok\":true"), std::string::npos) << line;
    const int index = std::stoi(line.substr(line.find("\"index\":") + 8));
    const Sent& s = sent.at(index);
    EXPECT_NE(line.find("\"opcode\":" + std::to_string(s.opcode) + ","), std::string::npos) << line;
    EXPECT_NE(line.find("\"dest_qp\":" + std::to_string(s.qpn) + ","), std::string::npos) << line;
    EXPECT_NE(line.find("\"psn\":" + std::to_string(s.psn) + ","), std::string::npos) << line;
  }
  const std::string summary = ReadText(err);
  const std::string want = std::to_string(sent.size()) + " packets, " + std::to_string(sent.size()) +
                           " RoCE, 0 skipped (not RoCEv2), 0 malformed, 0 ICRC bad";
  EXPECT_NE(summary.find(want), std::string::npos) << summary;

  // The text format too, and the exit status for a file that is not a capture.
  const Command text = RunShell("tools/uroce_decode " + original, err);
  EXPECT_EQ(text.status, 0);
  EXPECT_EQ(Split(text.out, '\n').size(), sent.size());
  EXPECT_EQ(text.out.find("icrc=bad"), std::string::npos) << text.out;
  EXPECT_EQ(RunShell("tools/uroce_decode " + TempPath("no-such-file.pcap"), err).status, 1);
  EXPECT_NE(ReadText(err).find("No such file or directory"), std::string::npos);
  EXPECT_EQ(RunShell("tools/uroce_decode", err).status, 2);
}

// Wireshark's default format: the same capture rewritten by tshark as pcapng (Section Header, Interface Description
// and Enhanced Packet Blocks) decodes with uroce_decode exactly as the pcap does, line for line.
TEST(Tshark, UroceDecodeReadsTsharksPcapngAsItReadsThePcap) {
  ASSERT_TRUE(HaveTshark()) << "tshark is not installed: run `tools/uroce setup` (Debian package tshark)";
  for (wire::PcapLinkType link_type : {wire::PcapLinkType::kRaw, wire::PcapLinkType::kEthernet}) {
    SCOPED_TRACE(wire::PcapLinkTypeName(static_cast<uint32_t>(link_type)));
    const std::string original = TempPath("roundtrip.pcap");
    const std::map<int, Sent> sent = WriteEveryOpcode(original, link_type);
    const std::string pcapng = TempPath("roundtrip.pcapng");
    const std::string err = TempPath("roundtrip.err");
    const Command convert = RunShell("tshark -r " + original + " -F pcapng -w " + pcapng, err);
    ASSERT_EQ(convert.status, 0) << ReadText(err);
    ASSERT_EQ(ReadText(pcapng).substr(0, 4), std::string("\x0A\x0D\x0D\x0A", 4)) << "tshark did not write pcapng";

    const Command from_pcap = RunShell("tools/uroce_decode " + original + " --json", err);
    ASSERT_EQ(from_pcap.status, 0) << ReadText(err);
    const std::string pcap_summary = ReadText(err);
    const Command from_pcapng = RunShell("tools/uroce_decode " + pcapng + " --json", err);
    ASSERT_EQ(from_pcapng.status, 0) << ReadText(err);
    EXPECT_EQ(Split(from_pcapng.out, '\n').size(), sent.size());
    EXPECT_EQ(from_pcapng.out, from_pcap.out);
    EXPECT_EQ(ReadText(err), pcap_summary);
  }
}

// The IB CM over RoCEv2: our CM MADs (wire/cm_mad.h) carried as the kernel sends them -- a UD SEND_ONLY to QP1 with
// the GSI Q_Key, from QP1 -- must be named by Wireshark's CM dissector with the values we encoded: a REQ as a
// ConnectRequest with our service ID, QPN and starting PSN and its private data as an IP CM header with our
// addresses; REP, RTU, REJ, DREQ and DREP with their communication IDs. Unlike the cases above, this one skips when
// tshark is missing.
TEST(Tshark, NamesOurCmMessages) {
  if (!HaveTshark()) GTEST_SKIP() << "tshark is not installed (Debian package tshark)";
  const wire::Flow flow{.src = {.addr = *wire::IpAddress::Parse("192.0.2.1"), .port = 0xC001},
                        .dst = {.addr = *wire::IpAddress::Parse("198.51.100.2"), .port = wire::kRoceV2UdpPort}};
  wire::CmReq req;
  req.local_comm_id = 0x1234ABCD;
  req.service_id = wire::ServiceIdOf(wire::kPortSpaceTcp, 7174);
  req.local_ca_guid = 0x0250B6FFFE112233;
  req.local_qpn = 0x000011;
  req.starting_psn = 0xABCDEF;
  req.path_mtu = 3;
  req.max_cm_retries = 15;
  req.remote_cm_response_timeout = 20;
  req.local_cm_response_timeout = 20;
  req.primary.local_gid = flow.src.addr.bytes();
  req.primary.remote_gid = flow.dst.addr.bytes();
  req.primary.hop_limit = 64;
  req.primary.local_ack_timeout = 17;
  const auto cma = wire::EncodeCmaHeader({.src_port = 45678, .src = flow.src.addr, .dst = flow.dst.addr});
  std::copy(cma.begin(), cma.end(), req.private_data.begin());
  // Each message with what tshark must show of it (fields in tshark's own formatting).
  struct Expected {
    wire::CmMessage message;
    std::string info;
    std::vector<std::pair<std::string, std::string>> fields;
  };
  const std::vector<Expected> expected = {
      {req,
       "CM: ConnectRequest",
       {{"infiniband.cm.req", "0x1234abcd"},
        {"infiniband.cm.req.serviceid", "0x0000000001061c06"},
        {"infiniband.cm.req.localcaguid", "0x0250b6fffe112233"},
        {"infiniband.cm.req.localqpn", "0x000011"},
        {"infiniband.cm.req.startpsn", "0xabcdef"},
        {"infiniband.cm.req.pppmtu", "0x03"},
        {"infiniband.cm.req.maxcmretr", "0x0f"},
        {"infiniband.cm.req.pkey", "0xffff"},
        {"infiniband.cm.req.prim_localgid_ipv4", "192.0.2.1"},
        {"infiniband.cm.req.prim_remotegid_ipv4", "198.51.100.2"},
        {"infiniband.cm.req.prim_hoplim", "0x40"},
        {"infiniband.cm.req.prim_localacktout", "0x11"},
        {"infiniband.cm.req.ip_cm.majv", "0x00"},
        {"infiniband.cm.req.ip_cm.ipv", "0x04"},
        {"infiniband.cm.req.ip_cm.sport", "0xb26e"},
        {"infiniband.cm.req.ip_cm.sip4", "192.0.2.1"},
        {"infiniband.cm.req.ip_cm.dip4", "198.51.100.2"}}},
      {wire::CmRep{.local_comm_id = 0xCAFE0001,
                   .remote_comm_id = 0x1234ABCD,
                   .local_qpn = 0x22,
                   .starting_psn = 0x123456,
                   .target_ack_delay = 15,
                   .rnr_retry_count = 7,
                   .local_ca_guid = 0x1122334455667788},
       "CM: ConnectReply",
       {{"infiniband.cm.rep", "0xcafe0001"},
        {"infiniband.cm.rep.remotecommid", "0x1234abcd"},
        {"infiniband.cm.rep.localqpn", "0x000022"},
        {"infiniband.cm.rep.startpsn", "0x123456"},
        {"infiniband.cm.rep.tgtackdelay", "0x0f"},
        {"infiniband.cm.rep.rnrretrcount", "0x07"},
        {"infiniband.cm.rep.localcaguid", "0x1122334455667788"}}},
      {wire::CmRtu{.local_comm_id = 0x1234ABCD, .remote_comm_id = 0xCAFE0001},
       "CM: ReadyToUse",
       {{"infiniband.cm.rtu.localcommid", "0x1234abcd"}, {"infiniband.cm.rtu.remotecommid", "0xcafe0001"}}},
      {wire::CmRej{.remote_comm_id = 0x1234ABCD, .message_rejected = wire::CmMessageRef::kReq, .reason = 8},
       "CM: ConnectReject",
       {{"infiniband.cm.rej.localcommid", "0x00000000"},
        {"infiniband.cm.rej.remotecommid", "0x1234abcd"},
        {"infiniband.cm.rej.reason", "0x0008"}}},
      {wire::CmDreq{.local_comm_id = 0x1234ABCD, .remote_comm_id = 0xCAFE0001, .remote_qpn = 0x22},
       "CM: DisconnectRequest",
       {{"infiniband.cm.dreq.localcommid", "0x1234abcd"},
        {"infiniband.cm.dreq.remotecommid", "0xcafe0001"},
        {"infiniband.cm.req.remoteqpneecn", "0x000022"}}},
      {wire::CmDrep{.local_comm_id = 0xCAFE0001, .remote_comm_id = 0x1234ABCD},
       "CM: DisconnectReply",
       {{"infiniband.cm.drsp.localcommid", "0xcafe0001"}, {"infiniband.cm.drsp.remotecommid", "0x1234abcd"}}},
  };

  const std::string path = TempPath("cm.pcap");
  wire::PcapWriter writer;
  ASSERT_EQ(writer.Open(path), 0);
  const uint64_t first_tid = 0x0000000100000000;
  for (size_t i = 0; i < expected.size(); ++i) {
    wire::PacketSpec spec;
    spec.bth.opcode = wire::opcode::kUdSendOnly;
    spec.bth.dest_qp = wire::kGsiQpn;
    spec.bth.psn = static_cast<uint32_t>(i);
    spec.deth = wire::Deth{.qkey = wire::kGsiQkey, .src_qp = wire::kGsiQpn};
    const auto mad = wire::EncodeCmMad({.transaction_id = first_tid + i, .message = expected[i].message});
    uint32_t icrc;
    ASSERT_EQ(writer.Write(1'700'000'000'000'000'000ull + i, SealedFrame(spec, mad, flow, &icrc)), 0);
  }
  ASSERT_EQ(writer.Close(), 0);

  // One tshark run for every field of every message: common columns first, then each message's fields.
  std::vector<std::string> columns = {"infiniband.bth.destqp", "infiniband.deth.q_key", "infiniband.mad.mgmtclass",
                                      "infiniband.mad.classversion", "infiniband.mad.method",
                                      "infiniband.mad.attributeid", "infiniband.mad.transactionid", "_ws.col.Info",
                                      "_ws.malformed"};
  const size_t common = columns.size();
  for (const Expected& e : expected)
    for (const auto& field : e.fields) columns.push_back(field.first);
  std::string command = "tshark -n -r " + path +
                        " -d udp.port==4791,infiniband -T fields -E separator=/t -E occurrence=f";
  for (const std::string& column : columns) command += " -e " + column;
  const std::string err = path + ".tshark.err";
  const Command tshark = RunShell(command, err);
  ASSERT_EQ(tshark.status, 0) << "tshark failed: " << ReadText(err);
  const std::vector<std::string> lines = Split(tshark.out, '\n');
  ASSERT_EQ(lines.size(), expected.size()) << tshark.out;
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(lines[i]);
    std::vector<std::string> f = Split(lines[i], '\t');
    f.resize(columns.size());
    EXPECT_EQ(std::stoul(f[0], nullptr, 0), wire::kGsiQpn);
    EXPECT_EQ(std::stoul(f[1], nullptr, 0), wire::kGsiQkey);
    EXPECT_EQ(f[2], "0x07");
    EXPECT_EQ(f[3], "0x02");
    EXPECT_EQ(f[4], "0x03");
    EXPECT_EQ(std::stoul(f[5], nullptr, 0), static_cast<uint16_t>(wire::AttributeOf(expected[i].message)));
    EXPECT_EQ(std::stoull(f[6], nullptr, 0), first_tid + i);
    EXPECT_EQ(f[7], expected[i].info);
    EXPECT_EQ(f[8], "") << "tshark flagged the packet as malformed";
    for (size_t c = common; c < columns.size(); ++c) {
      for (const auto& [field, value] : expected[i].fields) {
        if (field == columns[c]) EXPECT_EQ(f[c], value) << field;
      }
    }
  }
}

}  // namespace
}  // namespace uroce
