// Independent agreement with scapy (Debian's python3-scapy, scapy.contrib.roce): the script builds IPv4/UDP/BTH with
// scapy, packs the extension headers by hand from the IBTA layouts, and lets scapy compute the ICRC. For every frame
// we parse, check the fields the script says it wrote, verify the ICRC, re-encode from the parsed fields and compare
// bytes, and check that corrupting covered bits is caught.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "wire/bytes.h"
#include "wire/frame.h"
#include "wire/icrc.h"
#include "wire/packet.h"

namespace uroce::wire {
namespace {

constexpr char kPython[] = "/usr/bin/python3";

std::string ScriptPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  std::string base = srcdir ? srcdir : ".";
  return base + "/" + (workspace ? workspace : "uroce") + "/wire/testdata/scapy_vectors.py";
}

// Runs the script; returns its stdout lines. Fails the test (and returns nothing) if it cannot run.
std::vector<std::string> RunScript() {
  if (access(kPython, X_OK) != 0) {
    ADD_FAILURE() << kPython << " is missing: install Debian's python3 and python3-scapy (tools/uroce setup)";
    return {};
  }
  const std::string script = ScriptPath();
  if (access(script.c_str(), R_OK) != 0) {
    ADD_FAILURE() << "test data not found at " << script;
    return {};
  }
  const std::string cmd = std::string(kPython) + " '" + script + "' 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return {};
  }
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0) {
    ADD_FAILURE() << cmd << " exited with status " << status
                  << " (is python3-scapy installed for /usr/bin/python3?). Output:\n"
                  << out;
    return {};
  }
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

std::map<std::string, std::string> Fields(const std::string& line) {
  std::map<std::string, std::string> f;
  std::istringstream in(line);
  for (std::string token; in >> token;) {
    const size_t eq = token.find('=');
    if (eq != std::string::npos) f[token.substr(0, eq)] = token.substr(eq + 1);
  }
  return f;
}

std::vector<uint8_t> FromHex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoul(hex.substr(i, 2), nullptr, 16)));
  return out;
}

uint64_t Num(const std::map<std::string, std::string>& f, const std::string& key) {
  auto it = f.find(key);
  EXPECT_NE(it, f.end()) << key;
  return it == f.end() ? 0 : std::stoull(it->second);
}

TEST(ScapyAgreement, EveryOpcode) {
  const std::vector<std::string> lines = RunScript();
  ASSERT_FALSE(lines.empty());
  std::set<uint8_t> covered;
  size_t flips_checked = 0;
  for (const std::string& line : lines) {
    const auto f = Fields(line);
    ASSERT_TRUE(f.count("frame")) << line;
    SCOPED_TRACE(f.at("name"));
    const std::vector<uint8_t> frame = FromHex(f.at("frame"));

    auto ip = ParseIpUdpFrame(frame);
    ASSERT_TRUE(ip.has_value()) << ToString(ip.error());
    EXPECT_EQ(ip->flow.src.addr, *IpAddress::Parse(f.at("src")));
    EXPECT_EQ(ip->flow.dst.addr, *IpAddress::Parse(f.at("dst")));
    EXPECT_EQ(ip->flow.src.port, Num(f, "sport"));
    EXPECT_EQ(ip->flow.dst.port, kRoceV2UdpPort);
    EXPECT_EQ(ip->flow.ip_id, Num(f, "ipid"));
    EXPECT_EQ(ip->ttl, Num(f, "ttl"));
    EXPECT_EQ(ip->tos, Num(f, "tos"));
    EXPECT_TRUE(ip->dont_fragment);

    auto pkt = ParsePacket(ip->udp_payload);
    ASSERT_TRUE(pkt.has_value()) << ToString(pkt.error());
    const PacketView& v = *pkt;
    EXPECT_EQ(v.bth.opcode, Num(f, "opcode"));
    EXPECT_EQ(v.info->name, f.at("name"));
    covered.insert(v.bth.opcode);
    EXPECT_EQ(v.bth.psn, Num(f, "psn"));
    EXPECT_EQ(v.bth.dest_qp, Num(f, "dqpn"));
    EXPECT_EQ(v.bth.pkey, Num(f, "pkey"));
    EXPECT_EQ(v.bth.solicited, Num(f, "se") != 0);
    EXPECT_EQ(v.bth.mig_req, Num(f, "m") != 0);
    EXPECT_EQ(v.bth.ack_req, Num(f, "ackreq") != 0);
    EXPECT_EQ(v.bth.fecn, Num(f, "fecn") != 0);
    EXPECT_EQ(v.bth.becn, Num(f, "becn") != 0);
    EXPECT_EQ(v.bth.pad_count, Num(f, "pad"));
    EXPECT_EQ(v.payload.size(), Num(f, "payload_len"));
    EXPECT_EQ(v.rdeth.has_value(), f.count("rdeth_eecn") == 1);
    if (v.rdeth) {
      EXPECT_EQ(v.rdeth->eecn, Num(f, "rdeth_eecn"));
    }
    EXPECT_EQ(v.deth.has_value(), f.count("deth_qkey") == 1);
    if (v.deth) {
      EXPECT_EQ(v.deth->qkey, Num(f, "deth_qkey"));
      EXPECT_EQ(v.deth->src_qp, Num(f, "deth_sqp"));
    }
    EXPECT_EQ(v.xrc.has_value(), f.count("xrc_srqn") == 1);
    if (v.xrc) {
      EXPECT_EQ(v.xrc->srqn, Num(f, "xrc_srqn"));
    }
    EXPECT_EQ(v.reth.has_value(), f.count("reth_va") == 1);
    if (v.reth) {
      EXPECT_EQ(v.reth->va, Num(f, "reth_va"));
      EXPECT_EQ(v.reth->rkey, Num(f, "reth_rkey"));
      EXPECT_EQ(v.reth->dma_length, Num(f, "reth_len"));
    }
    EXPECT_EQ(v.atomic.has_value(), f.count("atomic_va") == 1);
    if (v.atomic) {
      EXPECT_EQ(v.atomic->va, Num(f, "atomic_va"));
      EXPECT_EQ(v.atomic->rkey, Num(f, "atomic_rkey"));
      EXPECT_EQ(v.atomic->swap_add, Num(f, "atomic_swap"));
      EXPECT_EQ(v.atomic->compare, Num(f, "atomic_cmp"));
    }
    EXPECT_EQ(v.aeth.has_value(), f.count("aeth_syn") == 1);
    if (v.aeth) {
      EXPECT_EQ(v.aeth->syndrome, Num(f, "aeth_syn"));
      EXPECT_EQ(v.aeth->msn, Num(f, "aeth_msn"));
    }
    EXPECT_EQ(v.atomic_ack.has_value(), f.count("ack_orig") == 1);
    if (v.atomic_ack) {
      EXPECT_EQ(v.atomic_ack->original, Num(f, "ack_orig"));
    }
    EXPECT_EQ(v.imm.has_value(), f.count("imm") == 1);
    if (v.imm) {
      const std::vector<uint8_t> wire_imm = FromHex(f.at("imm"));
      uint8_t got[4];
      v.imm->Encode(got);
      EXPECT_EQ(std::vector<uint8_t>(got, got + 4), wire_imm);
    }
    EXPECT_EQ(v.ieth.has_value(), f.count("ieth_rkey") == 1);
    if (v.ieth) {
      EXPECT_EQ(v.ieth->rkey, Num(f, "ieth_rkey"));
    }

    // scapy's ICRC agrees with ours.
    const IcrcCheck check = VerifyIcrc(ip->flow, ip->udp_payload);
    EXPECT_TRUE(check.ok) << std::hex << "got " << check.got << " want " << check.want;
    EXPECT_EQ(v.icrc, check.got);
    // As a receiver on a UDP socket would: without the IPv4 ID, recover it from the ICRC.
    EXPECT_EQ(RecoverIpId(Flow{ip->flow.src, ip->flow.dst, 0}, ip->udp_payload),
              std::optional<uint16_t>(ip->flow.ip_id));

    // Re-encode from the parsed fields: identical UDP payload and identical IP frame.
    const std::vector<uint8_t> payload(v.payload.begin(), v.payload.end());
    PacketSpec spec = SpecFromView(v);
    std::vector<uint8_t> encoded(EncodedLength(spec, payload.size()));
    auto n = EncodePacket(spec, payload, encoded);
    ASSERT_TRUE(n.has_value()) << ToString(n.error());
    SealIcrc(ip->flow, encoded);
    EXPECT_EQ(encoded, std::vector<uint8_t>(ip->udp_payload.begin(), ip->udp_payload.end()));
    std::vector<uint8_t> rebuilt(IpUdpFrameLength(false, encoded.size()));
    ASSERT_EQ(BuildIpUdpFrame(ip->flow, encoded, rebuilt, ip->ttl, ip->tos), rebuilt.size());
    EXPECT_EQ(rebuilt, frame);

    // Any single flipped bit of BTH..pad is an ICRC mismatch -- except BTH byte 4 (FECN, BECN, reserved), which the
    // ICRC masks so that switches may mark congestion without recomputing it. Sample about 48 bits per packet.
    std::vector<uint8_t> flipped = encoded;
    const size_t covered_bits = (encoded.size() - kIcrcSize) * 8;
    const size_t stride = covered_bits / 48 + 1;
    for (size_t bit = (Num(f, "psn") % stride); bit < covered_bits; bit += stride) {
      flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      EXPECT_EQ(VerifyIcrc(ip->flow, flipped).ok, bit / 8 == 4) << "bit " << bit;
      flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      ++flips_checked;
    }
    flipped[4] ^= 0xC0;  // FECN + BECN
    EXPECT_TRUE(VerifyIcrc(ip->flow, flipped).ok);
  }
  EXPECT_EQ(covered.size(), AllOpcodes().size()) << "scapy vectors should cover every opcode in the table";
  EXPECT_GT(flips_checked, 5000u);
  std::printf("checked %zu scapy frames, %zu opcodes, %zu bit flips\n", lines.size(), covered.size(), flips_checked);
}

}  // namespace
}  // namespace uroce::wire
