#include "tools/decode_format.h"

#include <cinttypes>
#include <cstdio>
#include <variant>
#include <vector>

#include "wire/bytes.h"
#include "wire/cm_mad.h"
#include "wire/frame.h"
#include "wire/icrc.h"
#include "wire/packet.h"

namespace uroce::tools {
namespace {

using wire::PacketView;

std::string Hex(uint64_t value, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*" PRIx64, digits, value);
  return buf;
}

// Builds one JSON object left to right; values are numbers, booleans, strings or nested objects.
class Json {
 public:
  Json& Num(const char* key, uint64_t value) { return Raw(key, std::to_string(value)); }
  Json& Bool(const char* key, bool value) { return Raw(key, value ? "true" : "false"); }
  Json& Str(const char* key, const std::string& value) { return Raw(key, JsonString(value)); }
  Json& Obj(const char* key, const Json& value) { return Raw(key, value.Close()); }
  Json& Raw(const char* key, const std::string& value) {
    text_ += text_.empty() ? "{" : ",";
    text_ += JsonString(key);
    text_ += ":";
    text_ += value;
    return *this;
  }
  std::string Close() const { return text_.empty() ? "{}" : text_ + "}"; }

 private:
  std::string text_;
};

// The UDP destination port of an IP packet, if the packet is UDP and long enough to show it; used to tell a
// RoCEv2 packet the capture cut short from an unrelated one, without trusting the rest of the headers.
std::optional<uint16_t> PeekUdpDestinationPort(std::span<const uint8_t> ip, bool* is_udp) {
  *is_udp = false;
  if (ip.empty()) return std::nullopt;
  size_t udp_offset;
  if (ip[0] >> 4 == 4) {
    if (ip.size() < 20) return std::nullopt;
    *is_udp = ip[9] == wire::kIpProtoUdp;
    udp_offset = size_t{ip[0] & 0x0Fu} * 4;
  } else if (ip[0] >> 4 == 6) {
    if (ip.size() < 40) return std::nullopt;
    *is_udp = ip[6] == wire::kIpProtoUdp;
    udp_offset = 40;
  } else {
    return std::nullopt;
  }
  if (!*is_udp || ip.size() < udp_offset + 4) return std::nullopt;
  return wire::LoadBe16(ip.data() + udp_offset + 2);
}

uint32_t ImmediateValue(const wire::ImmDt& imm) {
  // ImmDt keeps the wire bytes as they are (headers.h); show them read in network order, as Wireshark does.
  uint8_t bytes[wire::ImmDt::kSize];
  imm.Encode(bytes);
  return wire::LoadBe32(bytes);
}

std::string AethKindName(wire::AethKind kind) {
  switch (kind) {
    case wire::AethKind::kAck: return "ACK";
    case wire::AethKind::kRnrNak: return "RNR_NAK";
    case wire::AethKind::kNak: return "NAK";
    case wire::AethKind::kReserved: break;
  }
  return "reserved";
}

// --- CM MADs: a UD packet to QP1 whose management class is CM is named by its message --------------------------

// One field of a CM message: text `key=value` (hex of at least `digits` digits, decimal when digits is 0) and
// ` (name)` when named; JSON "key": value and "key_name": name.
struct CmField {
  const char* key;
  uint64_t value;
  int digits;
  std::string_view name = {};
};

// What decode shows of a CM MAD: the message's name and fields (and the cma_hdr of a REQ or SIDR_REQ that has one),
// or why it is not a CM message the kernel would take.
struct CmSummary {
  std::string_view message;
  std::vector<CmField> fields;
  std::optional<wire::CmaHeader> cma;
  std::string_view malformed;  // empty when the MAD parsed
};

template <typename... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <typename... F>
Overloaded(F...) -> Overloaded<F...>;

// The summary of a UD packet to QP1 whose payload has the CM management class; nullopt for any other packet.
std::optional<CmSummary> SummarizeCm(const PacketView& p) {
  if (!p.deth || p.bth.dest_qp != wire::kGsiQpn || p.payload.size() < 2 || p.payload[1] != wire::kMgmtClassCm) {
    return std::nullopt;
  }
  CmSummary s;
  auto mad = wire::ParseCmMad(p.payload);
  if (!mad) {
    s.malformed = wire::ToString(mad.error());
    return s;
  }
  s.message = wire::ToString(wire::AttributeOf(mad->message));
  auto ids = [](const auto& m) {
    return std::vector<CmField>{{"comm", m.local_comm_id, 8}, {"remote", m.remote_comm_id, 8}};
  };
  std::visit(Overloaded{
                 [&](const wire::CmReq& m) {
                   s.fields = {{"comm", m.local_comm_id, 8},
                               {"sid", m.service_id, 16},
                               {"qpn", m.local_qpn, 1},
                               {"psn", m.starting_psn, 1}};
                   s.cma = wire::ParseCmaHeader(m.private_data);
                 },
                 [&](const wire::CmMra& m) {
                   s.fields = ids(m);
                   s.fields.push_back({"timeout", m.service_timeout, 0});
                 },
                 [&](const wire::CmRej& m) {
                   s.fields = ids(m);
                   s.fields.push_back({"reason", m.reason, 0, ToString(static_cast<wire::CmRejectReason>(m.reason))});
                 },
                 [&](const wire::CmRep& m) {
                   s.fields = ids(m);
                   s.fields.push_back({"qpn", m.local_qpn, 1});
                   if (m.local_eecn != 0) s.fields.push_back({"eecn", m.local_eecn, 1});  // an XRC target's QPN
                   s.fields.push_back({"psn", m.starting_psn, 1});
                 },
                 [&](const wire::CmDreq& m) {
                   s.fields = ids(m);
                   s.fields.push_back({"remote_qpn", m.remote_qpn, 1});
                 },
                 [&](const auto& m) { s.fields = ids(m); },  // RTU, DREP
                 [&](const wire::CmSidrReq& m) {
                   s.fields = {{"req", m.request_id, 8}, {"sid", m.service_id, 16}};
                   s.cma = wire::ParseCmaHeader(m.private_data);
                 },
                 [&](const wire::CmSidrRep& m) {
                   s.fields = {{"req", m.request_id, 8},
                               {"status", static_cast<uint8_t>(m.status), 0, ToString(m.status)},
                               {"qpn", m.qpn, 1},
                               {"qkey", m.qkey, 8}};
                 },
             },
             mad->message);
  return s;
}

// " CM REQ comm=0x1234abcd sid=0x0000000001061c06 qpn=0x11 psn=0xabcdef cma 127.0.0.2:45678->127.0.0.1",
// " CM REJ comm=0x00000000 remote=0x1234abcd reason=8 (INVALID_SERVICE_ID)", " CM malformed: <why>".
std::string CmText(const CmSummary& s) {
  if (!s.malformed.empty()) return " CM malformed: " + std::string(s.malformed);
  std::string text = " CM " + std::string(s.message);
  for (const CmField& f : s.fields) {
    text += std::string(" ") + f.key + "=" + (f.digits != 0 ? Hex(f.value, f.digits) : std::to_string(f.value));
    if (!f.name.empty()) text += " (" + std::string(f.name) + ")";
  }
  if (s.cma) {
    text += " cma " + wire::UdpEndpoint{.addr = s.cma->src, .port = s.cma->src_port}.ToString() + "->" +
            s.cma->dst.ToString();
  }
  return text;
}

// {"message": "REQ", "comm": ..., "cma": {"src": "127.0.0.2", "src_port": 45678, "dst": "127.0.0.1"}} or
// {"malformed": "<why>"}.
Json CmJson(const CmSummary& s) {
  Json json;
  if (!s.malformed.empty()) return json.Str("malformed", std::string(s.malformed));
  json.Str("message", std::string(s.message));
  for (const CmField& f : s.fields) {
    json.Num(f.key, f.value);
    if (!f.name.empty()) json.Str((std::string(f.key) + "_name").c_str(), std::string(f.name));
  }
  if (s.cma) {
    json.Obj("cma",
             Json().Str("src", s.cma->src.ToString()).Num("src_port", s.cma->src_port).Str("dst", s.cma->dst.ToString()));
  }
  return json;
}

std::string TextLine(uint64_t index, uint64_t timestamp_ns, const wire::IpUdpFrame& frame, const PacketView& p,
                     const wire::IcrcCheck& icrc) {
  const wire::Bth& bth = p.bth;
  std::string line = "#" + std::to_string(index) + " " + FormatTimestamp(timestamp_ns) + " " +
                     frame.flow.src.ToString() + " > " + frame.flow.dst.ToString() + " " + std::string(p.info->name);
  line += " qp=" + Hex(bth.dest_qp, 6) + " psn=" + Hex(bth.psn, 6);
  line += std::string(" se=") + (bth.solicited ? "1" : "0") + " mig=" + (bth.mig_req ? "1" : "0") +
          " ackreq=" + (bth.ack_req ? "1" : "0") + " pad=" + std::to_string(bth.pad_count) +
          " pkey=" + Hex(bth.pkey, 4);
  if (bth.fecn) line += " FECN";
  if (bth.becn) line += " BECN";
  if (p.rdeth) line += " rdeth{eecn=" + Hex(p.rdeth->eecn, 6) + "}";
  if (p.deth) line += " deth{qkey=" + Hex(p.deth->qkey, 8) + " src_qp=" + Hex(p.deth->src_qp, 6) + "}";
  if (p.xrc) line += " xrceth{srqn=" + Hex(p.xrc->srqn, 6) + "}";
  if (p.reth) {
    line += " reth{va=" + Hex(p.reth->va, 1) + " rkey=" + Hex(p.reth->rkey, 8) +
            " len=" + std::to_string(p.reth->dma_length) + "}";
  }
  if (p.atomic) {
    line += " atomiceth{va=" + Hex(p.atomic->va, 1) + " rkey=" + Hex(p.atomic->rkey, 8) +
            " swap_add=" + Hex(p.atomic->swap_add, 1) + " compare=" + Hex(p.atomic->compare, 1) + "}";
  }
  if (p.aeth) line += " aeth{" + p.aeth->ToString() + "}";
  if (p.atomic_ack) line += " atomicacketh{original=" + Hex(p.atomic_ack->original, 1) + "}";
  if (p.imm) line += " imm=" + Hex(ImmediateValue(*p.imm), 8);
  if (p.ieth) line += " ieth{rkey=" + Hex(p.ieth->rkey, 8) + "}";
  line += " payload=" + std::to_string(p.payload.size());
  if (icrc.ok) {
    line += " icrc=ok";
  } else {
    line += " icrc=bad (got " + Hex(icrc.got, 8) + ", want " + Hex(icrc.want, 8) + ")";
  }
  if (auto cm = SummarizeCm(p)) line += CmText(*cm);
  return line;
}

std::string JsonLine(uint64_t index, uint64_t timestamp_ns, const wire::IpUdpFrame& frame, const PacketView& p,
                     const wire::IcrcCheck& icrc) {
  const wire::Bth& bth = p.bth;
  Json json;
  json.Num("index", index)
      .Raw("ts", FormatTimestamp(timestamp_ns))
      .Num("ts_ns", timestamp_ns)
      .Str("src", frame.flow.src.ToString())
      .Str("dst", frame.flow.dst.ToString())
      .Num("opcode", bth.opcode)
      .Str("opcode_name", std::string(p.info->name))
      .Str("transport", std::string(wire::ToString(p.info->transport)))
      .Num("dest_qp", bth.dest_qp)
      .Num("psn", bth.psn)
      .Bool("se", bth.solicited)
      .Bool("mig_req", bth.mig_req)
      .Bool("ack_req", bth.ack_req)
      .Num("pad", bth.pad_count)
      .Num("pkey", bth.pkey)
      .Num("tver", bth.transport_version)
      .Bool("fecn", bth.fecn)
      .Bool("becn", bth.becn);
  if (p.rdeth) json.Obj("rdeth", Json().Num("eecn", p.rdeth->eecn));
  if (p.deth) json.Obj("deth", Json().Num("qkey", p.deth->qkey).Num("src_qp", p.deth->src_qp));
  if (p.xrc) json.Obj("xrceth", Json().Num("srqn", p.xrc->srqn));
  if (p.reth) {
    json.Obj("reth", Json().Num("va", p.reth->va).Num("rkey", p.reth->rkey).Num("len", p.reth->dma_length));
  }
  if (p.atomic) {
    json.Obj("atomiceth", Json()
                              .Num("va", p.atomic->va)
                              .Num("rkey", p.atomic->rkey)
                              .Num("swap_add", p.atomic->swap_add)
                              .Num("compare", p.atomic->compare));
  }
  if (p.aeth) {
    const wire::Aeth& aeth = *p.aeth;
    Json a;
    a.Num("syndrome", aeth.syndrome).Str("kind", AethKindName(aeth.kind()));
    switch (aeth.kind()) {
      case wire::AethKind::kAck:
        a.Num("credits", aeth.credit_count());
        break;
      case wire::AethKind::kRnrNak:
        a.Num("rnr_timer", aeth.rnr_timer()).Num("rnr_timer_us", wire::RnrTimerMicros(aeth.rnr_timer()));
        break;
      case wire::AethKind::kNak:
        a.Num("nak_code", static_cast<uint8_t>(aeth.nak_code())).Str("nak", std::string(ToString(aeth.nak_code())));
        break;
      case wire::AethKind::kReserved:
        break;
    }
    a.Num("msn", aeth.msn);
    json.Obj("aeth", a);
  }
  if (p.atomic_ack) json.Obj("atomicacketh", Json().Num("original", p.atomic_ack->original));
  if (p.imm) json.Num("imm", ImmediateValue(*p.imm));
  if (p.ieth) json.Obj("ieth", Json().Num("rkey", p.ieth->rkey));
  json.Num("payload_len", p.payload.size()).Num("icrc", icrc.got).Num("icrc_want", icrc.want).Bool("icrc_ok", icrc.ok);
  if (auto cm = SummarizeCm(p)) json.Obj("cm", CmJson(*cm));
  return json.Close();
}

}  // namespace

std::string FormatTimestamp(uint64_t timestamp_ns) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%" PRIu64 ".%09" PRIu64, timestamp_ns / 1'000'000'000,
                timestamp_ns % 1'000'000'000);
  return buf;
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c >= 0x7F) {
          // Reasons and names are ASCII; anything else is escaped byte by byte so the output is always valid.
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += "\"";
  return out;
}

std::string PacketDecoder::Malformed(uint64_t index, uint64_t timestamp_ns, const std::string* src,
                                     const std::string* dst, const std::string& reason) {
  ++counts_.malformed;
  if (format_ == DecodeFormat::kJson) {
    Json json;
    json.Num("index", index).Raw("ts", FormatTimestamp(timestamp_ns)).Num("ts_ns", timestamp_ns);
    if (src != nullptr) json.Str("src", *src).Str("dst", *dst);
    json.Str("malformed", reason);
    return json.Close();
  }
  std::string line = "#" + std::to_string(index) + " " + FormatTimestamp(timestamp_ns);
  if (src != nullptr) line += " " + *src + " > " + *dst;
  return line + " malformed: " + reason;
}

std::optional<std::string> PacketDecoder::Decode(const wire::PcapRecord& record) {
  if (record.ip_packet.empty()) {
    ++counts_.packets;
    if (!record.malformed) {
      ++counts_.skipped;
      return std::nullopt;
    }
    return Malformed(record.index, record.timestamp_ns, nullptr, nullptr, record.not_ip);
  }
  std::optional<std::string> line =
      DecodeIp(record.index, record.timestamp_ns, record.ip_packet, record.truncated ? record.original_length : 0);
  return line;
}

std::optional<std::string> PacketDecoder::DecodeIp(uint64_t index, uint64_t timestamp_ns,
                                                   std::span<const uint8_t> ip_packet, uint32_t original_length) {
  ++counts_.packets;
  auto frame = wire::ParseIpUdpFrame(ip_packet);
  if (!frame) {
    // Only a packet that can still be seen to be UDP to 4791 is a broken RoCEv2 packet; anything else (TCP, ICMP,
    // fragments of other traffic) is not ours to judge.
    bool is_udp = false;
    std::optional<uint16_t> port = PeekUdpDestinationPort(ip_packet, &is_udp);
    const bool could_be_roce = is_udp && (!port || *port == wire::kRoceV2UdpPort);
    if (!could_be_roce || frame.error() == wire::FrameError::kNotUdp ||
        frame.error() == wire::FrameError::kFragment) {
      ++counts_.skipped;
      return std::nullopt;
    }
    std::string reason = "IP/UDP " + std::string(wire::ToString(frame.error()));
    if (original_length != 0) {
      reason += " (capture cut at " + std::to_string(ip_packet.size()) + " bytes by snaplen; " +
                std::to_string(original_length) + " on the wire)";
    }
    return Malformed(index, timestamp_ns, nullptr, nullptr, reason);
  }
  if (frame->flow.dst.port != wire::kRoceV2UdpPort) {
    ++counts_.skipped;
    return std::nullopt;
  }
  const std::string src = frame->flow.src.ToString();
  const std::string dst = frame->flow.dst.ToString();
  auto packet = wire::ParsePacket(frame->udp_payload);
  if (!packet) {
    std::string reason = std::string(wire::ToString(packet.error()));
    if (!frame->udp_payload.empty()) reason += " (opcode " + Hex(frame->udp_payload[0], 2) + ")";
    return Malformed(index, timestamp_ns, &src, &dst, reason);
  }
  ++counts_.roce;
  const wire::IcrcCheck icrc = wire::VerifyIcrc(frame->flow, frame->udp_payload);
  if (!icrc.ok) ++counts_.icrc_bad;
  return format_ == DecodeFormat::kJson ? JsonLine(index, timestamp_ns, *frame, *packet, icrc)
                                        : TextLine(index, timestamp_ns, *frame, *packet, icrc);
}

std::string PacketDecoder::FileError(uint64_t index, const std::string& message) {
  ++counts_.malformed;
  if (format_ == DecodeFormat::kJson) return Json().Num("index", index).Str("malformed", message).Close();
  return "#" + std::to_string(index) + " malformed: " + message;
}

std::string PacketDecoder::Summary() const {
  return std::to_string(counts_.packets) + " packets, " + std::to_string(counts_.roce) + " RoCE, " +
         std::to_string(counts_.skipped) + " skipped (not RoCEv2), " + std::to_string(counts_.malformed) +
         " malformed, " + std::to_string(counts_.icrc_bad) + " ICRC bad";
}

}  // namespace uroce::tools
