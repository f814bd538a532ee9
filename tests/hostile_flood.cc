// hostile_flood: what another process on the host can throw at a uroce device's UDP port without any of its keys.
// Sends, from an address of its own, a seeded mix of datagrams at each target until its time is up:
//   random bytes of random length; empty datagrams; 64 KiB ones; valid packets cut short; packets with a valid ICRC
//   and random fields (any opcode of the table, random PSN, keys, addresses and lengths; half of them to the QP named
//   by --qpn, which the victim printed); the same with the ICRC spoiled; CM MADs (REQ, REP, RTU, DREQ, DREP, REJ,
//   MRA) with random IDs to QP1; CNPs to the named QP.
// It never takes the address of the victim's peer: what a stranger can do, not what a spoofer on the path can (RoCE
// has no authentication against that, on any HCA).
//
// Usage: hostile_flood --to=IP[,IP...] [--qpn=N] [--seconds=S] [--seed=S] [--port=4791]
// Prints "hostile_flood: sent N datagrams (...per kind...)" and exits 0; 2 on a usage error or a socket failure.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "wire/cm_mad.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace {

using uroce::wire::UdpEndpoint;

enum Kind { kRandom, kEmpty, kHuge, kTruncated, kRandomFields, kBadIcrc, kCmMad, kCnp, kKinds };
const char* const kKindNames[kKinds] = {"random", "empty", "huge", "truncated", "valid-icrc", "bad-icrc", "cm-mad", "cnp"};

struct Options {
  std::vector<std::string> targets;
  uint32_t qpn = 0;
  double seconds = 5;
  uint64_t seed = 1;
  uint16_t port = uroce::wire::kRoceV2UdpPort;
};

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) return false;
    const std::string key = arg.substr(2, eq - 2), value = arg.substr(eq + 1);
    if (key == "to") {
      for (size_t at = 0; at <= value.size();) {
        const size_t comma = value.find(',', at);
        const size_t end = comma == std::string::npos ? value.size() : comma;
        if (end > at) o->targets.push_back(value.substr(at, end - at));
        at = end + 1;
      }
    } else if (key == "qpn") {
      o->qpn = uint32_t(std::strtoul(value.c_str(), nullptr, 0)) & 0xffffff;
    } else if (key == "seconds") {
      o->seconds = std::strtod(value.c_str(), nullptr);
    } else if (key == "seed") {
      o->seed = std::strtoull(value.c_str(), nullptr, 0);
    } else if (key == "port") {
      o->port = uint16_t(std::strtoul(value.c_str(), nullptr, 0));
    } else {
      return false;
    }
  }
  return !o->targets.empty();
}

class Flood {
 public:
  Flood(const Options& o) : o_(o), random_(o.seed) {}

  // A packet with every header its opcode needs, each field random, sealed for `flow` (or not).
  std::vector<uint8_t> RandomPacket(const uroce::wire::Flow& flow, bool to_named_qp) {
    using namespace uroce::wire;
    const auto opcodes = AllOpcodes();
    const OpcodeInfo& info = opcodes[Below(opcodes.size())];
    PacketSpec spec;
    spec.bth.opcode = info.code;
    spec.bth.solicited = Below(2);
    spec.bth.mig_req = Below(2);
    spec.bth.pkey = Below(4) == 0 ? uint16_t(random_()) : kDefaultPkey;
    spec.bth.dest_qp = to_named_qp ? o_.qpn : uint32_t(random_()) & 0xffffff;
    spec.bth.ack_req = Below(2);
    spec.bth.psn = uint32_t(random_()) & 0xffffff;
    spec.rdeth = Rdeth{.eecn = uint32_t(random_()) & 0xffffff};
    spec.deth = Deth{.qkey = uint32_t(random_()), .src_qp = uint32_t(random_()) & 0xffffff};
    spec.xrc = XrcEth{.srqn = uint32_t(random_()) & 0xffffff};
    spec.reth = Reth{random_(), uint32_t(random_()), uint32_t(random_()) >> Below(32)};
    spec.atomic = AtomicEth{random_(), uint32_t(random_()), random_(), random_()};
    spec.aeth = Aeth{uint8_t(random_()), uint32_t(random_()) & 0xffffff};
    spec.atomic_ack = AtomicAckEth{random_()};
    spec.imm = ImmDt{uint32_t(random_())};
    spec.ieth = Ieth{uint32_t(random_())};
    std::vector<uint8_t> payload;
    if (info.fixed_payload != 0) {
      payload.resize(info.fixed_payload);
    } else if (info.has_payload) {
      payload.resize(Below(4) == 0 ? Below(4097) : Below(65));
    }
    for (uint8_t& b : payload) b = uint8_t(random_());
    std::vector<uint8_t> bytes(EncodedLength(spec, payload.size()));
    if (!EncodePacket(spec, payload, bytes)) return {};
    SealIcrc(flow, bytes);
    return bytes;
  }

  std::vector<uint8_t> CmMadPacket(const uroce::wire::Flow& flow) {
    using namespace uroce::wire;
    CmMad mad;
    mad.transaction_id = random_();
    const uint32_t local = uint32_t(random_()), remote = uint32_t(random_());
    switch (Below(7)) {
      case 0: {
        CmReq m;
        m.local_comm_id = local;
        m.service_id = random_();
        m.local_ca_guid = random_();
        m.local_qpn = uint32_t(random_()) & 0xffffff;
        mad.message = m;
        break;
      }
      case 1: {
        CmRep m;
        m.local_comm_id = local;
        m.remote_comm_id = remote;
        m.local_qpn = uint32_t(random_()) & 0xffffff;
        mad.message = m;
        break;
      }
      case 2: mad.message = CmRtu{.local_comm_id = local, .remote_comm_id = remote}; break;
      case 3: {
        CmDreq m;
        m.local_comm_id = local;
        m.remote_comm_id = remote;
        mad.message = m;
        break;
      }
      case 4: mad.message = CmDrep{.local_comm_id = local, .remote_comm_id = remote}; break;
      case 5: {
        CmRej m;
        m.local_comm_id = local;
        m.remote_comm_id = remote;
        m.message_rejected = CmMessageRef(Below(3));
        m.reason = uint16_t(Below(40));
        mad.message = m;
        break;
      }
      default: {
        CmMra m;
        m.local_comm_id = local;
        m.remote_comm_id = remote;
        m.message_mraed = CmMessageRef(Below(3));
        mad.message = m;
        break;
      }
    }
    const auto body = EncodeCmMad(mad);
    const PacketSpec spec = GsiMadSpec(uint32_t(random_()));
    std::vector<uint8_t> bytes(EncodedLength(spec, body.size()));
    if (!EncodePacket(spec, body, bytes)) return {};
    SealIcrc(flow, bytes);
    return bytes;
  }

  std::vector<uint8_t> Cnp(const uroce::wire::Flow& flow) {
    using namespace uroce::wire;
    PacketSpec spec;
    spec.bth.opcode = opcode::kCnp;
    spec.bth.pkey = kDefaultPkey;
    spec.bth.dest_qp = o_.qpn;
    const std::vector<uint8_t> reserved(16);
    std::vector<uint8_t> bytes(EncodedLength(spec, reserved.size()));
    if (!EncodePacket(spec, reserved, bytes)) return {};
    SealIcrc(flow, bytes);
    return bytes;
  }

  std::vector<uint8_t> Next(Kind kind, const uroce::wire::Flow& flow) {
    std::vector<uint8_t> bytes;
    switch (kind) {
      case kRandom:
        bytes.resize(Below(1500));
        for (uint8_t& b : bytes) b = uint8_t(random_());
        break;
      case kEmpty:
        break;
      case kHuge:
        bytes.resize(65000);
        for (uint8_t& b : bytes) b = uint8_t(random_());
        break;
      case kTruncated:
        bytes = RandomPacket(flow, Below(2));
        if (!bytes.empty()) bytes.resize(Below(bytes.size()));
        break;
      case kRandomFields:
        bytes = RandomPacket(flow, Below(2));
        break;
      case kBadIcrc:
        bytes = RandomPacket(flow, Below(2));
        if (!bytes.empty()) bytes[Below(bytes.size())] ^= uint8_t(1u << Below(8));
        break;
      case kCmMad:
        bytes = CmMadPacket(flow);
        break;
      case kCnp:
        bytes = Cnp(flow);
        break;
      case kKinds:
        break;
    }
    return bytes;
  }

  // Mostly packets that pass the first checks (those reach the protocol code), some of everything else.
  Kind PickKind() {
    static constexpr int kWeights[kKinds] = {10, 3, 1, 10, 40, 10, 16, 10};
    int r = int(Below(100));
    for (int k = 0; k < kKinds; ++k) {
      if (r < kWeights[k]) return Kind(k);
      r -= kWeights[k];
    }
    return kRandomFields;
  }

  uint64_t Below(uint64_t n) { return n == 0 ? 0 : random_() % n; }

 private:
  const Options& o_;
  std::mt19937_64 random_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    std::fprintf(stderr, "usage: hostile_flood --to=IP[,IP...] [--qpn=N] [--seconds=S] [--seed=S] [--port=4791]\n");
    return 2;
  }
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  // Don't fragment: the IPv4 ID is then 0, the value the victims verify the ICRC with first.
  const int pmtu = IP_PMTUDISC_DO;
  sockaddr_in self{};
  self.sin_family = AF_INET;
  self.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t self_len = sizeof self;
  if (fd < 0 || setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu) != 0 ||
      bind(fd, reinterpret_cast<sockaddr*>(&self), sizeof self) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) != 0) {
    std::perror("hostile_flood: socket");
    return 2;
  }
  const int big = 1 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  std::vector<sockaddr_in> targets;
  std::vector<uroce::wire::Flow> flows;
  for (const std::string& t : o.targets) {
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(o.port);
    if (inet_pton(AF_INET, t.c_str(), &to.sin_addr) != 1) {
      std::fprintf(stderr, "hostile_flood: bad address %s\n", t.c_str());
      return 2;
    }
    targets.push_back(to);
    uroce::wire::Flow flow;
    flow.src = UdpEndpoint{uroce::wire::IpAddress::V4(ntohl(self.sin_addr.s_addr)), ntohs(self.sin_port)};
    flow.dst = UdpEndpoint{uroce::wire::IpAddress::V4(ntohl(to.sin_addr.s_addr)), o.port};
    flows.push_back(flow);
  }
  Flood flood(o);
  uint64_t sent[kKinds] = {}, total = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (size_t i = 0; i < targets.size(); ++i) {
      const Kind kind = flood.PickKind();
      const std::vector<uint8_t> bytes = flood.Next(kind, flows[i]);
      // A full socket buffer (ENOBUFS, EAGAIN) or the ICMP of a closed port (ECONNREFUSED) is part of the game.
      if (sendto(fd, bytes.data(), bytes.size(), 0, reinterpret_cast<const sockaddr*>(&targets[i]),
                 sizeof targets[i]) >= 0) {
        ++sent[kind];
        ++total;
      }
    }
  }
  std::printf("hostile_flood: sent %llu datagrams (", static_cast<unsigned long long>(total));
  for (int k = 0; k < kKinds; ++k)
    std::printf("%s%s %llu", k ? ", " : "", kKindNames[k], static_cast<unsigned long long>(sent[k]));
  std::printf(")\n");
  return 0;
}
