// libFuzzer target for the emulated HCA (//emu:device): a stateful fuzzer. Each input builds a fresh simulated fabric
// (emu/test_fabric.h) of three devices -- the victim, the peer it is connected to, and a stranger -- with live objects
// of every kind on the victim: an RC QP connected to the peer's with remote read/write/atomic memory and posted
// receives, an RC QP on a basic SRQ, a UC pair, a UD QP, an XRC target with its SRQ and an XRC initiator, a type 2
// memory window, and connection manager state (a listener, connections established, half-way through the handshake
// and half-way through the disconnection). Then it plays the input (device_fuzzer.h): datagrams injected at the
// victim, aimed at those live objects, interleaved with legitimate verbs and with time passing, and checks after each
// pump what must hold whatever the packets were (Invariants below). A violated invariant aborts (__builtin_trap).
//
// Build and run (clang): bazel --output_base=$HOME/.cache/uroce-fuzz-output build --config=fuzz //emu/fuzz:device_fuzzer
//                        bazel-bin/emu/fuzz/device_fuzzer -max_total_time=60 emu/fuzz/corpus
// The same entry point runs under the normal build in //emu/fuzz:device_fuzzer_replay_test.
#include "emu/fuzz/device_fuzzer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "emu/device.h"
#include "emu/rc_state.h"
#include "emu/test_fabric.h"
#include "wire/cm_mad.h"
#include "wire/frame.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace uroce::emu::fuzz {
namespace {

using testing::Fabric;
using testing::Node;

// --- invariants ---------------------------------------------------------------------------------------------------

[[noreturn]] void Violated(const char* what) {
  std::fprintf(stderr, "device_fuzzer: invariant violated: %s\n", what);
  __builtin_trap();
}
#define FUZZ_CHECK(condition) \
  do {                        \
    if (!(condition)) Violated(#condition); \
  } while (0)

// --- the bench's shape ----------------------------------------------------------------------------------------------

constexpr Mtu kMtu = Mtu::k1024;  // small enough that a message of a few KiB is several packets
constexpr Mtu kSmallMtu = Mtu::k256;  // the RC pair on the SRQ: a 16 KiB WRITE is 64 packets, twice the path's window
// Enough for every WR the queues can hold (6 x 64 sends; 3 x 64 + 128 receives; 128 in the XRC SRQ): the CQs are
// drained after every pump.
constexpr uint32_t kCqCapacity = 512;
constexpr QpCapabilities kQpCap{64, 64, 4, 4, 64};
constexpr uint32_t kSrqCapacity = 128;
constexpr uint32_t kUdQkey = 0x11111111;
constexpr uint32_t kRemoteAll =
    access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead | access::kRemoteAtomic;
// PSNs near the top of the 24-bit space, so that a few packets wrap (IBTA 9.7.1).
constexpr uint32_t kVictimSendPsn = 0xFFFFF0;
constexpr uint32_t kPeerSendPsn = 0x000100;
// Bounds on one input's work, so that no input runs for long: records played, rounds of one pump.
constexpr size_t kMaxRecords = 256;
constexpr int kPumpRounds = 256;
constexpr int kMaxRoundsPerInput = 4096;
// Rounds in a row that deliver packets at one instant of the clock before Pump calls it a livelock. Each round a
// node takes up to 256 queued datagrams: legitimate exchanges at one instant end within a few round trips.
constexpr int kStormRounds = 128;
constexpr uint64_t kFinalPumpNs = 10'000'000;  // what is in flight at the end gets 10 ms of simulated time
constexpr uint64_t kUs = 1000, kMs = 1'000'000;

// Receive and READ/atomic buffers are slots, each written through two SGEs, [0, 1200) and [1280, 2480): a message of
// up to 2400 bytes, three packets at the 1024 MTU. The bytes between and after the SGEs are never in any work request,
// so nothing may write them.
constexpr size_t kSlotSize = 2560;
constexpr uint32_t kSgeLength = 1200;
constexpr uint32_t kSecondSgeOffset = 1280;
constexpr uint32_t kSlotCapacity = 2 * kSgeLength;
struct Gap {
  size_t offset, length;
};
constexpr Gap kSlotGaps[] = {{kSgeLength, kSecondSgeOffset - kSgeLength},
                             {kSecondSgeOffset + kSgeLength, kSlotSize - kSecondSgeOffset - kSgeLength}};

struct MemorySpec {
  uint64_t iova;
  uint64_t length;
};
// Fixed IOVAs (not the host addresses), so that captures naming them stay valid from run to run.
constexpr MemorySpec kMemorySpecs[kMemoryCount] = {
    {0x10000, 4096},            // rw
    {0x20000, 1024},            // read-only
    {0x30000, 1024},            // canary
    {0x40000, 16 * kSlotSize},  // recv
    {0x50000, 4096},            // src
    {0x80000, 8 * kSlotSize},   // dst
    {0x10000, 2048},            // window over rw
};

// Guard bytes around every registered body: a write just outside a region lands there (inside one allocation, where
// AddressSanitizer cannot see it).
constexpr size_t kGuard = 64;

// One registered buffer and what may change in it.
struct Region {
  enum class Rule : uint8_t {
    kAnything,   // peers may write any byte
    kImmutable,  // nothing may write it: no remote write is granted and no work request writes into it
    kSlots,      // only the SGEs of work requests may be written (never kSlotGaps)
  };
  Rule rule = Rule::kAnything;
  std::vector<uint8_t> storage;  // guard, body, guard
  std::vector<uint8_t> initial;  // the body as filled
  std::vector<uint8_t> frozen;   // the body when deregistered: nothing may change it afterwards
  MemoryRegion mr;
  uint32_t access = 0;
  uint64_t iova = 0;
  bool registered = false;

  uint8_t* body() { return storage.data() + kGuard; }
  size_t length() const { return storage.size() - 2 * kGuard; }
  Sge At(uint64_t offset, uint32_t length) const { return {mr.iova + offset, length, mr.lkey}; }

  // Guards and body take the bytes of `pattern` (the same for every input: computing them per input cost more than
  // running most inputs).
  void Fill(const std::vector<uint8_t>& pattern) {
    storage = pattern;
    initial.assign(body(), body() + length());
  }
  int Register(Device& dev, ProtectionDomain* pd) {
    const int err = dev.RegisterMr(pd, body(), length(), iova, access, &mr);
    registered = err == 0;
    if (registered) frozen.clear();
    return err;
  }
  void Deregister(Device& dev) {
    if (!registered) return;
    FUZZ_CHECK(dev.DeregisterMr(mr.lkey) == 0);
    registered = false;
    frozen.assign(body(), body() + length());  // IBTA 10.6.3.2: after deregistration the region is not accessed
  }
};

// Every work request posted and not yet completed, by wr_id (unique per device): a completion must name one, and
// each completes at most once; a QP in the error state has completed all of its own.
struct Ledger {
  struct Receive {
    uint32_t capacity = 0;  // bytes its SGEs hold
    uint32_t qpn = 0;       // the QP whose receive queue holds it; 0 on an SRQ
  };
  std::unordered_map<uint64_t, Receive> receives;
  std::unordered_map<uint64_t, uint32_t> sends;  // wr_id -> QPN
  std::unordered_set<uint32_t> qpns;
  uint64_t next_wr_id = 1;
  // The newest wr_id completed per send queue and per receive queue of a QP (not an SRQ, which several QPs take
  // from): wr_ids grow in post order, and a queue's work completes in that order (IBTA 10.8.5).
  std::unordered_map<uint32_t, uint64_t> last_send, last_receive;
  // RESET discards a QP's work requests without completions (IBTA 10.3.1).
  void Forget(uint32_t qpn) {
    std::erase_if(sends, [&](const auto& e) { return e.second == qpn; });
    std::erase_if(receives, [&](const auto& e) { return e.second.qpn == qpn; });
  }
};

bool IsValidWcOpcode(WcOpcode op) {
  switch (op) {
    case WcOpcode::kSend:
    case WcOpcode::kRdmaWrite:
    case WcOpcode::kRdmaRead:
    case WcOpcode::kCompSwap:
    case WcOpcode::kFetchAdd:
    case WcOpcode::kBindMw:
    case WcOpcode::kLocalInv:
    case WcOpcode::kTso:
    case WcOpcode::kAtomicWrite:
    case WcOpcode::kRecv:
    case WcOpcode::kRecvRdmaWithImm:
      return true;
  }
  return false;
}

// --- the connection manager's consumer ------------------------------------------------------------------------------

// How a consumer (librdmacm) answers the events of one id; a connection's context points at one.
struct CmAnswers {
  uint8_t req = 0;  // 0 REP, 1 REJ, 2 Drop, 3 nothing (the id stays in REQ_RCVD)
  bool rep = true;  // the RTU (false: nothing, the id stays in REP_RCVD)
  bool reject_rep = false;  // a REJ instead of the RTU
  bool drep = true;  // a DREP for a DREQ (false: the id stays in DREQ_RCVD)
  bool sidr = true;  // a SIDR_REP for a SIDR_REQ (false: Drop)
};

// Answers from inside the event callback, as librdmacm does; remembers the ids it heard of.
class CmConsumer final : public CmEventSink {
 public:
  CmConsumer(ConnectionManager& cm, const uint32_t* qpn) : cm_(cm), qpn_(qpn) { cm_.SetSink(this); }
  ~CmConsumer() override { cm_.SetSink(nullptr); }

  void OnCmEvent(const CmEvent& e) override {
    if (record) events.push_back(e);
    if (std::find(ids.begin(), ids.end(), e.id) == ids.end() && ids.size() < 32) ids.push_back(e.id);
    const CmAnswers& a = e.context != nullptr ? *static_cast<const CmAnswers*>(e.context) : defaults;
    switch (e.type) {
      case CmEventType::kReqReceived:
        if (a.req == 0) cm_.SendRep(e.id, Rep(e.req.starting_psn));
        if (a.req == 1) cm_.SendRej(e.id, static_cast<uint16_t>(wire::CmRejectReason::kConsumerDefined), {});
        if (a.req == 2) cm_.Drop(e.id);
        break;
      case CmEventType::kRepReceived:
        if (a.reject_rep) {
          cm_.SendRej(e.id, static_cast<uint16_t>(wire::CmRejectReason::kConsumerDefined), {});
        } else if (a.rep) {
          cm_.SendRtu(e.id, {});
        }
        break;
      case CmEventType::kDreqReceived:
        if (a.drep) cm_.SendDrep(e.id);
        break;
      case CmEventType::kSidrReqReceived:
        if (a.sidr) {
          wire::CmSidrRep rep;
          rep.qpn = *qpn_;
          rep.qkey = kUdQkey;
          cm_.SendSidrRep(e.id, rep);
        } else {
          cm_.Drop(e.id);
        }
        break;
      default:
        break;
    }
  }

  wire::CmRep Rep(uint32_t psn) const {
    wire::CmRep r;
    r.local_qpn = *qpn_;
    r.starting_psn = psn ^ 0x5a5a5a;
    r.responder_resources = 4;
    r.initiator_depth = 4;
    r.rnr_retry_count = 7;
    return r;
  }

  CmAnswers defaults;
  bool record = true;  // set-up only: events are large
  std::vector<CmEvent> events;
  std::vector<uint32_t> ids;

 private:
  ConnectionManager& cm_;
  const uint32_t* qpn_;
};

wire::CmReq MakeReq(uint64_t service_id, uint32_t qpn, uint32_t psn) {
  wire::CmReq r;
  r.service_id = service_id;
  r.local_qpn = qpn;
  r.responder_resources = 4;
  r.initiator_depth = 4;
  // The kernel's rdma_cm values: a REQ goes again every 2 x ms(16) + ms(20) = 4.6 s, 15 times.
  r.remote_cm_response_timeout = 20;
  r.local_cm_response_timeout = 20;
  r.starting_psn = psn;
  r.retry_count = 7;
  r.rnr_retry_count = 7;
  r.path_mtu = static_cast<uint8_t>(kMtu);
  r.max_cm_retries = 15;
  r.primary.local_lid = r.primary.remote_lid = 0xFFFF;
  r.primary.hop_limit = 64;
  r.primary.local_ack_timeout = 17;
  return r;
}

constexpr uint64_t kVictimService = wire::ServiceIdOf(wire::kPortSpaceTcp, 7471);
constexpr uint64_t kPeerSilentService = wire::ServiceIdOf(wire::kPortSpaceTcp, 7472);   // REQ_RCVD, never answered
constexpr uint64_t kPeerAnswerService = wire::ServiceIdOf(wire::kPortSpaceTcp, 7473);   // answers everything
constexpr uint64_t kPeerNoDrepService = wire::ServiceIdOf(wire::kPortSpaceTcp, 7474);   // answers all but DREQs

// --- one device's objects ---------------------------------------------------------------------------------------

struct Side {
  Node* node = nullptr;
  Device& dev() { return *node->device; }
  ProtectionDomain* pd = nullptr;
  CompletionQueue *send_cq = nullptr, *recv_cq = nullptr, *xrc_cq = nullptr;
  std::array<Region, kMemoryCount - 1> regions;  // every Memory but the window
  SharedReceiveQueue *srq = nullptr, *xsrq = nullptr;
  XrcDomain* xrcd = nullptr;
  QueuePair *rc = nullptr, *rc_srq = nullptr, *uc = nullptr, *ud = nullptr, *xrc_tgt = nullptr, *xrc_ini = nullptr;
  AddressHandle* ah = nullptr;  // towards the other side
  uint32_t mw_rkey = 0;
  uint32_t rc_qpn_for_cm = 0;
  Ledger ledger;
  size_t next_recv_slot = 0, next_dst_slot = 0;
  uint8_t seed = 0;  // of its regions' fill patterns
  std::unique_ptr<CmConsumer> cm;

  // The QPs by role, in this order; a destroyed one is nullptr, its number stays known.
  std::array<uint32_t, 6> numbers{};
  Region& region(Memory m) { return regions[m]; }
  std::array<QueuePair*, 6> qps() const { return {rc, rc_srq, uc, ud, xrc_tgt, xrc_ini}; }
  QueuePair*& role(size_t i) {
    QueuePair** roles[] = {&rc, &rc_srq, &uc, &ud, &xrc_tgt, &xrc_ini};
    return *roles[i % 6];
  }
};

// --- the bench ------------------------------------------------------------------------------------------------------

class Bench {
 public:
  Bench();
  ~Bench();
  void Play(std::span<const uint8_t> input);
  LiveNumbers Describe();

 private:
  // Set-up.
  void BuildSide(Side& s, uint8_t seed);
  void ConnectQp(Device& dev, QueuePair* qp, const Device& peer, uint32_t peer_qpn, uint32_t rq_psn, uint32_t sq_psn,
                 Mtu mtu = kMtu);
  void SetUpConnections();
  // Time.
  void Pump(uint64_t deadline_ns, int max_rounds = kPumpRounds);
  // Records.
  void InjectPacket(uint8_t flags, uint8_t selector, std::span<const uint8_t> bytes);
  void InjectCmMad(uint8_t flags, uint8_t selector, std::span<const uint8_t> bytes);
  void Operate(uint8_t selector, std::span<const uint8_t> params);
  // Verbs, with the ledger kept.
  bool PostSend(Side& s, QueuePair* qp, SendWr wr);
  void PostRecv(Side& s, QueuePair* qp, SharedReceiveQueue* srq, size_t count);
  void BindWindow(Side& s);
  uint32_t TargetQpn(Target t) const;
  QueuePair* TargetQp(Target t) const;
  // Invariants.
  void DrainAndCheck(Side& s);
  void CheckInvariants();

  Fabric fabric_;
  Side victim_, peer_;
  Node* stranger_ = nullptr;
  CmAnswers victim_answers_;  // the victim's listener's (options byte)
  CmAnswers answer_all_, silent_, no_drep_;
  uint32_t listen_id_ = 0;
  LiveNumbers cm_ids_;
  uint32_t gsi_psn_ = 0;
  int rounds_left_ = kMaxRoundsPerInput;
  uint64_t last_round_ns_ = 0;
  int same_instant_rounds_ = 0;
};

// UROCE_TRACE=1 prints every device's decision trace on stderr, as the engine does: run the fuzzer (or the replay
// test) on one input to follow what the protocol did with it.
DeviceConfig BenchConfig() {
  DeviceConfig config;
  // The values the engine takes for its trace switch (verbs_api/engine.cc).
  const char* env = std::getenv("UROCE_TRACE");
  const std::string_view trace = env != nullptr ? env : "";
  if (trace == "1" || trace == "yes" || trace == "true") {
    config.trace = [](std::string_view line) {
      std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
    };
  }
  return config;
}

Bench::Bench() : fabric_(BenchConfig()) {
  victim_.node = &fabric_.AddNode(kMtu);
  peer_.node = &fabric_.AddNode(kMtu);
  stranger_ = &fabric_.AddNode(kMtu);
  BuildSide(victim_, 0x11);
  BuildSide(peer_, 0x77);
  // The pairs: victim.rc <-> peer.rc, victim.rc_srq <-> peer.rc_srq, victim.uc <-> peer.uc, victim.xrc_tgt <->
  // peer.xrc_ini, victim.xrc_ini <-> peer.xrc_tgt; UD through address handles.
  for (auto [s, o] : {std::pair{&victim_, &peer_}, std::pair{&peer_, &victim_}}) {
    const uint32_t rq = s == &victim_ ? kPeerSendPsn : kVictimSendPsn;
    const uint32_t sq = s == &victim_ ? kVictimSendPsn : kPeerSendPsn;
    ConnectQp(s->dev(), s->rc, o->dev(), o->rc->qpn(), rq, sq);
    ConnectQp(s->dev(), s->rc_srq, o->dev(), o->rc_srq->qpn(), rq, sq, kSmallMtu);
    ConnectQp(s->dev(), s->uc, o->dev(), o->uc->qpn(), rq, sq);
    ConnectQp(s->dev(), s->xrc_tgt, o->dev(), o->xrc_ini->qpn(), rq, sq);
    ConnectQp(s->dev(), s->xrc_ini, o->dev(), o->xrc_tgt->qpn(), rq, sq);
    AddressVector av;
    av.dgid = o->dev().config().address.bytes();
    FUZZ_CHECK(s->dev().CreateAh(s->pd, av, &s->ah) == 0);
  }
  for (Side* s : {&victim_, &peer_}) {
    PostRecv(*s, s->rc, nullptr, 8);
    PostRecv(*s, nullptr, s->srq, 8);
    PostRecv(*s, s->uc, nullptr, 8);
    PostRecv(*s, s->ud, nullptr, 8);
    PostRecv(*s, nullptr, s->xsrq, 8);
    BindWindow(*s);
    s->rc_qpn_for_cm = s->rc->qpn();
    s->cm = std::make_unique<CmConsumer>(s->dev().connection_manager(), &s->rc_qpn_for_cm);
  }
  Pump(fabric_.clock().NowNs() + kMs);
  SetUpConnections();
  DrainAndCheck(victim_);
  DrainAndCheck(peer_);
  victim_.cm->record = peer_.cm->record = false;
}

Bench::~Bench() {
  // The consumers go before the devices whose connection managers call them.
  victim_.cm.reset();
  peer_.cm.reset();
}

// The bytes a region of `size` is filled with (guards included), made once per process.
const std::vector<uint8_t>& Pattern(size_t size, uint8_t seed) {
  static std::map<std::pair<size_t, uint8_t>, std::vector<uint8_t>> patterns;
  std::vector<uint8_t>& p = patterns[{size, seed}];
  if (p.empty()) {
    p.resize(size);
    for (size_t i = 0; i < size; ++i) p[i] = static_cast<uint8_t>(seed + i * 131 + (i >> 8));
  }
  return p;
}

void Bench::BuildSide(Side& s, uint8_t seed) {
  Device& d = s.dev();
  s.seed = seed;
  s.pd = d.AllocPd();
  FUZZ_CHECK(d.CreateCq(kCqCapacity, &s.send_cq) == 0);
  FUZZ_CHECK(d.CreateCq(kCqCapacity, &s.recv_cq) == 0);
  FUZZ_CHECK(d.CreateCq(kCqCapacity, &s.xrc_cq) == 0);
  static constexpr uint32_t kAccess[kMemoryCount - 1] = {
      kRemoteAll | access::kMwBind,  // rw
      access::kRemoteRead,           // read-only
      access::kLocalWrite,           // canary
      access::kLocalWrite,           // recv
      0,                             // src
      access::kLocalWrite,           // dst
  };
  static constexpr Region::Rule kRules[kMemoryCount - 1] = {
      Region::Rule::kAnything, Region::Rule::kImmutable, Region::Rule::kImmutable,
      Region::Rule::kSlots,    Region::Rule::kImmutable, Region::Rule::kSlots,
  };
  for (size_t m = 0; m < s.regions.size(); ++m) {
    Region& r = s.regions[m];
    r.rule = kRules[m];
    r.access = kAccess[m];
    r.iova = kMemorySpecs[m].iova;
    r.Fill(Pattern(kMemorySpecs[m].length + 2 * kGuard, static_cast<uint8_t>(seed + m * 29)));
    FUZZ_CHECK(r.Register(d, s.pd) == 0);
  }
  SrqAttributes basic{kSrqCapacity, 2, 0};
  FUZZ_CHECK(d.CreateSrq(SrqType::kBasic, s.pd, nullptr, nullptr, basic, &s.srq) == 0);
  FUZZ_CHECK(d.OpenXrcd(std::nullopt, true, false, &s.xrcd) == 0);
  SrqAttributes xrc{kSrqCapacity, 2, 0};
  FUZZ_CHECK(d.CreateSrq(SrqType::kXrc, s.pd, s.xrcd, s.xrc_cq, xrc, &s.xsrq) == 0);

  auto create = [&](QpType type, SharedReceiveQueue* srq) {
    QpInitAttributes init;
    init.type = type;
    init.pd = s.pd;
    init.send_cq = s.send_cq;
    init.recv_cq = s.recv_cq;
    init.cap = kQpCap;
    init.srq = srq;
    if (type == QpType::kXrcRecv) init.xrcd = s.xrcd;
    QueuePair* qp = nullptr;
    FUZZ_CHECK(d.CreateQp(init, &qp) == 0);
    s.ledger.qpns.insert(qp->qpn());
    return qp;
  };
  s.rc = create(QpType::kRc, nullptr);
  s.rc_srq = create(QpType::kRc, s.srq);
  s.uc = create(QpType::kUc, nullptr);
  s.ud = create(QpType::kUd, nullptr);
  s.xrc_tgt = create(QpType::kXrcRecv, nullptr);
  s.xrc_ini = create(QpType::kXrcSend, nullptr);
  for (size_t i = 0; i < s.numbers.size(); ++i) s.numbers[i] = s.role(i)->qpn();

  QpAttributes a;
  a.qp_state = QpState::kInit;
  a.port_num = 1;
  a.qkey = kUdQkey;
  FUZZ_CHECK(d.ModifyQp(s.ud, a, attr::kState | attr::kPkeyIndex | attr::kPort | attr::kQkey) == 0);
  a.qp_state = QpState::kRtr;
  FUZZ_CHECK(d.ModifyQp(s.ud, a, attr::kState) == 0);
  a.qp_state = QpState::kRts;
  a.sq_psn = kVictimSendPsn;
  FUZZ_CHECK(d.ModifyQp(s.ud, a, attr::kState | attr::kSqPsn) == 0);

  FUZZ_CHECK(d.AllocMw(s.pd, 2, &s.mw_rkey) == 0);
}

// RESET -> INIT -> RTR -> RTS with the attributes each type's transitions require (the table in qp_state_machine.cc,
// ibv_modify_qp(3)).
void Bench::ConnectQp(Device& dev, QueuePair* qp, const Device& peer, uint32_t peer_qpn, uint32_t rq_psn,
                      uint32_t sq_psn, Mtu mtu) {
  const QpType type = qp->type();
  const bool responder = type == QpType::kRc || type == QpType::kXrcRecv;
  const bool requester = type == QpType::kRc || type == QpType::kXrcSend;
  QpAttributes a;
  a.qp_state = QpState::kInit;
  a.port_num = 1;
  a.qp_access_flags = type == QpType::kXrcSend ? 0 : access::kRemoteWrite | access::kRemoteRead | access::kRemoteAtomic;
  if (dev.ModifyQp(qp, a, attr::kState | attr::kPkeyIndex | attr::kPort | attr::kAccessFlags) != 0) return;
  a.qp_state = QpState::kRtr;
  a.path_mtu = mtu;
  a.dest_qp_num = peer_qpn;
  a.rq_psn = rq_psn;
  a.ah_attr.dgid = peer.config().address.bytes();
  a.ah_attr.is_global = true;
  a.ah_attr.port_num = 1;
  uint32_t mask = attr::kState | attr::kAv | attr::kPathMtu | attr::kDestQpn | attr::kRqPsn;
  if (responder) {
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;  // 0.01 ms (IBTA table 45)
    mask |= attr::kMaxDestRdAtomic | attr::kMinRnrTimer;
  }
  if (dev.ModifyQp(qp, a, mask) != 0) return;
  a.qp_state = QpState::kRts;
  a.sq_psn = sq_psn;
  a.timeout = 14;  // 67 ms
  a.retry_cnt = 7;
  a.rnr_retry = 6;  // not 7 (infinite): forged RNR NAKs must be able to fail a WR
  a.max_rd_atomic = 4;
  mask = attr::kState | attr::kSqPsn;
  if (requester) mask |= attr::kTimeout | attr::kRetryCnt | attr::kRnrRetry | attr::kMaxQpRdAtomic;
  if (type == QpType::kXrcRecv) mask |= attr::kTimeout;
  dev.ModifyQp(qp, a, mask);
}

// The victim's connection manager in every interesting state: listening; ESTABLISHED as the passive side; REP_SENT
// (the peer never sends the RTU); REQ_SENT (the peer never answers); ESTABLISHED as the active side; DREQ_SENT (the
// peer never sends the DREP). Short pumps: the CM's retransmission timers (4.6 s) must not fire yet.
void Bench::SetUpConnections() {
  answer_all_ = CmAnswers{};
  silent_ = CmAnswers{3, false, false, false, false};
  no_drep_ = CmAnswers{};
  no_drep_.drep = false;
  victim_answers_ = CmAnswers{};
  ConnectionManager& vcm = victim_.dev().connection_manager();
  ConnectionManager& pcm = peer_.dev().connection_manager();
  const wire::IpAddress victim_addr = victim_.dev().config().address;
  const wire::IpAddress peer_addr = peer_.dev().config().address;
  uint32_t unused = 0;
  FUZZ_CHECK(vcm.Listen(kVictimService, &victim_answers_, &listen_id_) == 0);
  FUZZ_CHECK(pcm.Listen(kPeerSilentService, &silent_, &unused) == 0);
  FUZZ_CHECK(pcm.Listen(kPeerAnswerService, &answer_all_, &unused) == 0);
  FUZZ_CHECK(pcm.Listen(kPeerNoDrepService, &no_drep_, &unused) == 0);
  auto settle = [&] { Pump(fabric_.clock().NowNs() + kMs); };
  auto last_event = [](CmConsumer& c, CmEventType t) -> const CmEvent* {
    for (auto it = c.events.rbegin(); it != c.events.rend(); ++it)
      if (it->type == t) return &*it;
    return nullptr;
  };
  LiveNumbers& n = cm_ids_;

  // The peer connects to the victim twice: the first handshake completes, the second stops before the RTU.
  uint32_t id = 0;
  FUZZ_CHECK(pcm.SendReq(victim_addr, MakeReq(kVictimService, peer_.rc->qpn(), kPeerSendPsn), &answer_all_, &id) == 0);
  settle();
  n.passive_established_remote = id;
  if (const CmEvent* e = last_event(*victim_.cm, CmEventType::kReqReceived)) n.passive_established_local = e->id;
  FUZZ_CHECK(pcm.SendReq(victim_addr, MakeReq(kVictimService, peer_.rc_srq->qpn(), kPeerSendPsn), &silent_, &id) ==
             0);
  settle();
  n.passive_rep_sent_remote = id;
  if (const CmEvent* e = last_event(*victim_.cm, CmEventType::kReqReceived)) n.passive_rep_sent_local = e->id;

  // The victim connects to the peer three times: unanswered, completed, and completed then disconnecting.
  FUZZ_CHECK(vcm.SendReq(peer_addr, MakeReq(kPeerSilentService, victim_.rc->qpn(), kVictimSendPsn), &silent_,
                         &n.active_req_sent_local) == 0);
  settle();
  if (const CmEvent* e = last_event(*peer_.cm, CmEventType::kReqReceived)) n.active_req_sent_remote = e->id;
  FUZZ_CHECK(vcm.SendReq(peer_addr, MakeReq(kPeerAnswerService, victim_.rc_srq->qpn(), kVictimSendPsn), &answer_all_,
                         &n.active_established_local) == 0);
  settle();
  if (const CmEvent* e = last_event(*peer_.cm, CmEventType::kReqReceived)) n.active_established_remote = e->id;
  FUZZ_CHECK(vcm.SendReq(peer_addr, MakeReq(kPeerNoDrepService, victim_.uc->qpn(), kVictimSendPsn), &answer_all_,
                         &n.active_dreq_sent_local) == 0);
  settle();
  if (const CmEvent* e = last_event(*peer_.cm, CmEventType::kReqReceived)) n.active_dreq_sent_remote = e->id;
  FUZZ_CHECK(vcm.SendDreq(n.active_dreq_sent_local) == 0);
  settle();

  FUZZ_CHECK(vcm.State(listen_id_) == CmState::kListen);
  FUZZ_CHECK(vcm.State(n.passive_established_local) == CmState::kEstablished);
  FUZZ_CHECK(vcm.State(n.passive_rep_sent_local) == CmState::kRepSent);
  FUZZ_CHECK(vcm.State(n.active_req_sent_local) == CmState::kReqSent);
  FUZZ_CHECK(vcm.State(n.active_established_local) == CmState::kEstablished);
  FUZZ_CHECK(vcm.State(n.active_dreq_sent_local) == CmState::kDreqSent);
}

// Delivers datagrams and runs timers, as Fabric::Pump does, but never past `deadline_ns` nor more than `max_rounds`
// rounds: protocols that retry (an RNR NAK answered by an RNR NAK) must not keep one input running.
void Bench::Pump(uint64_t deadline_ns, int max_rounds) {
  Node* nodes[] = {victim_.node, peer_.node, stranger_};
  for (int round = 0; round < max_rounds && rounds_left_ > 0; ++round, --rounds_left_) {
    // Packets that keep answering each other while no time passes are a livelock: every exchange the protocols
    // have either ends or waits for a timer (retransmission, RNR, CM), so a storm at one instant has no bound.
    const uint64_t now = fabric_.clock().NowNs();
    same_instant_rounds_ = now == last_round_ns_ ? same_instant_rounds_ + 1 : 0;
    last_round_ns_ = now;
    if (same_instant_rounds_ > kStormRounds) Violated("packets exchanged for rounds on end without time passing");
    int delivered = 0;
    for (Node* node : nodes) {
      Device* dev = node->device.get();
      const AckTiming acks = node->ack_timing;
      delivered += node->transport->Poll([dev, acks](const wire::InDatagram& d) { dev->OnDatagram(d, acks); }, 0);
    }
    uint64_t next_timer = 0;
    for (Node* node : nodes) next_timer = wire::EarlierDeadline(next_timer, node->device->RunTimers());
    if (delivered > 0) continue;
    const auto next_delivery = fabric_.network().NextDeliveryNs();
    const uint64_t target = wire::EarlierDeadline(next_delivery ? *next_delivery : 0, next_timer);
    if (target == 0 || target > deadline_ns) break;
    if (target > fabric_.clock().NowNs()) fabric_.clock().Set(target);
  }
  DrainAndCheck(victim_);
  DrainAndCheck(peer_);
}

// --- verbs with the ledger ------------------------------------------------------------------------------------------

bool Bench::PostSend(Side& s, QueuePair* qp, SendWr wr) {
  if (qp == nullptr) return false;  // destroyed
  wr.wr_id = s.ledger.next_wr_id++;
  wr.flags |= send_flags::kSignaled;
  const uint64_t id = wr.wr_id;
  s.ledger.sends[id] = qp->qpn();
  const int err = s.dev().PostSend(qp, std::move(wr));
  if (err != 0) s.ledger.sends.erase(id);  // refused at post time: nothing is queued, nothing completes
  return err == 0;
}

void Bench::PostRecv(Side& s, QueuePair* qp, SharedReceiveQueue* srq, size_t count) {
  if (qp == nullptr && srq == nullptr) return;  // destroyed
  Region& recv = s.region(kRecvMemory);
  const size_t slots = recv.length() / kSlotSize;
  for (size_t i = 0; i < count; ++i) {
    const uint64_t offset = (s.next_recv_slot++ % slots) * kSlotSize;
    RecvWr wr;
    wr.wr_id = s.ledger.next_wr_id++;
    wr.sg_list = {recv.At(offset, kSgeLength), recv.At(offset + kSecondSgeOffset, kSgeLength)};
    const uint64_t id = wr.wr_id;
    s.ledger.receives[id] = {kSlotCapacity, srq != nullptr ? 0 : qp->qpn()};
    const int err = srq != nullptr ? s.dev().PostSrqRecv(srq, std::move(wr)) : s.dev().PostRecv(qp, std::move(wr));
    if (err != 0) s.ledger.receives.erase(id);
  }
}

// A type 2 window on the RC QP over the first half of rw, remote read and write (IBTA 10.6.7.2).
void Bench::BindWindow(Side& s) {
  Region& rw = s.region(kRwMemory);
  if (!rw.registered) return;
  SendWr wr;
  wr.opcode = SendOpcode::kBindMw;
  const uint32_t next = (s.mw_rkey & ~0xffu) | ((s.mw_rkey + 1) & 0xff);
  wr.bind = {s.mw_rkey, next, rw.mr.lkey, rw.mr.iova, kMemorySpecs[kWindowMemory].length,
             access::kRemoteWrite | access::kRemoteRead};
  if (PostSend(s, s.rc, std::move(wr))) s.mw_rkey = next;
}

// --- packets --------------------------------------------------------------------------------------------------------

QueuePair* Bench::TargetQp(Target t) const {
  switch (t) {
    case kRcQp: return victim_.rc;
    case kRcOnSrqQp: return victim_.rc_srq;
    case kUcQp: return victim_.uc;
    case kUdQp: return victim_.ud;
    case kXrcTargetQp: return victim_.xrc_tgt;
    case kXrcInitiatorQp: return victim_.xrc_ini;
    default: return nullptr;
  }
}

uint32_t Bench::TargetQpn(Target t) const {
  switch (t) {
    case kRcQp: return victim_.numbers[0];
    case kRcOnSrqQp: return victim_.numbers[1];
    case kUcQp: return victim_.numbers[2];
    case kUdQp: return victim_.numbers[3];
    case kXrcTargetQp: return victim_.numbers[4];
    case kXrcInitiatorQp: return victim_.numbers[5];
    case kGsiQp: return wire::kGsiQpn;
    case kMulticastQp: return wire::kMulticastQpn;
    default: return 0x777;  // kUnknownQp
  }
}

// Where extension header `h` starts in a packet of opcode `info` (IBTA 9.2: they follow the BTH in a fixed order).
size_t HeaderOffset(const wire::OpcodeInfo& info, wire::ExtHeader h) {
  size_t offset = wire::Bth::kSize;
  for (wire::ExtHeader x : wire::kExtHeaderOrder) {
    if (x == h) break;
    if (info.headers & x) offset += wire::ExtHeaderSize(x);
  }
  return offset;
}

void Bench::InjectPacket(uint8_t flags, uint8_t selector, std::span<const uint8_t> input) {
  std::vector<uint8_t> bytes(input.begin(), input.end());
  const auto target = static_cast<Target>((selector & 0x0f) % kTargetCount);
  const auto memory = static_cast<Memory>((selector >> 4) % kMemoryCount);
  // The patches need the packet's structure; bytes that do not parse go as they are.
  if (auto view = wire::ParsePacket(bytes)) {
    const wire::OpcodeInfo& info = *view->info;
    wire::Bth bth = view->bth;
    if (target != kKeepQpn) bth.dest_qp = TargetQpn(target);
    if (flags & kPsnRelative) {
      // Relative to what the named QP expects next: its responder's PSN for a request, the oldest PSN its requester
      // waits to have acknowledged for a response.
      QueuePair* qp = TargetQp(target);
      uint32_t base = 0;
      if (qp != nullptr) base = info.is_request ? qp->attributes().rq_psn : qp->requester().state().acked_psn_next;
      bth.psn = PsnAdd(base, static_cast<int8_t>(view->bth.psn & 0xff));
    }
    bth.Encode(bytes.data());
    if ((flags & kPatchSrqn) && (info.headers & wire::kXrcEth)) {
      const size_t at = HeaderOffset(info, wire::kXrcEth);
      wire::XrcEth x = wire::XrcEth::Decode(bytes.data() + at);
      x.srqn = victim_.xsrq->srqn();
      x.Encode(bytes.data() + at);
    }
    if (flags & kPatchKeys) {
      const Region* region = memory == kWindowMemory ? &victim_.regions[kRwMemory] : &victim_.regions[memory];
      const uint32_t rkey = memory == kWindowMemory ? victim_.mw_rkey : region->mr.rkey;
      const uint64_t base = kMemorySpecs[memory].iova, length = kMemorySpecs[memory].length;
      if (info.headers & wire::kReth) {
        const size_t at = HeaderOffset(info, wire::kReth);
        wire::Reth r = wire::Reth::Decode(bytes.data() + at);
        r.rkey = rkey;
        r.va = base + (r.va - base) % (length + 1);  // an address already inside stays where it is
        r.Encode(bytes.data() + at);
      }
      if (info.headers & wire::kAtomicEth) {
        const size_t at = HeaderOffset(info, wire::kAtomicEth);
        wire::AtomicEth e = wire::AtomicEth::Decode(bytes.data() + at);
        e.rkey = rkey;
        e.va = base + (((e.va - base) % length) & ~uint64_t{7});
        e.Encode(bytes.data() + at);
      }
    }
  }
  Node& from = (flags & kFromStranger) ? *stranger_ : *peer_.node;
  const wire::UdpEndpoint dst{victim_.dev().config().address, wire::kRoceV2UdpPort};
  const uint16_t sport = wire::kRoceSourcePortMin;
  if (flags & kReseal) wire::SealIcrc(from.transport->OutgoingFlow(dst, sport), bytes);
  const wire::OutDatagram d{dst, sport, bytes, /*has_icrc=*/false};
  from.transport->Send(std::span(&d, 1));
}

void Bench::InjectCmMad(uint8_t flags, uint8_t selector, std::span<const uint8_t> input) {
  std::vector<uint8_t> mad(input.begin(), input.end());
  if (!(flags & kRawMadLength)) mad.resize(wire::kMadSize, 0);
  const wire::PacketSpec spec = wire::GsiMadSpec(gsi_psn_++);
  // Selector: which node it comes from (the peer, the stranger, or the victim itself: a dial to its own device).
  Node* nodes[] = {peer_.node, stranger_, victim_.node};
  Node& from = *nodes[selector % 3];
  std::vector<uint8_t> bytes(wire::EncodedLength(spec, mad.size()));
  if (!wire::EncodePacket(spec, mad, bytes)) return;
  const wire::UdpEndpoint dst{victim_.dev().config().address, wire::kRoceV2UdpPort};
  const uint16_t sport = wire::RoceSourcePort(wire::kGsiQpn, wire::kGsiQpn);
  wire::SealIcrc(from.transport->OutgoingFlow(dst, sport), bytes);
  const wire::OutDatagram d{dst, sport, bytes};
  from.transport->Send(std::span(&d, 1));
}

// --- legitimate operations ------------------------------------------------------------------------------------------

// Reads an operation's parameters; zeros once they run out.
class Params {
 public:
  explicit Params(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  uint8_t U8() { return at_ < bytes_.size() ? bytes_[at_++] : 0; }
  uint16_t U16() {
    const uint8_t low = U8();
    return static_cast<uint16_t>(low | U8() << 8);
  }
  uint32_t U32() {
    const uint16_t low = U16();
    return low | uint32_t{U16()} << 16;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t at_ = 0;
};

void Bench::Operate(uint8_t selector, std::span<const uint8_t> bytes) {
  Params p(bytes);
  Side& v = victim_;
  Side& o = peer_;
  // A READ or atomic lands in a slot of dst, through the slot's two SGEs.
  auto dst_sges = [](Side& s, uint32_t len) {
    Region& dst = s.region(kDstMemory);
    const uint64_t offset = (s.next_dst_slot++ % (dst.length() / kSlotSize)) * kSlotSize;
    std::vector<Sge> sges{dst.At(offset, std::min(len, kSgeLength))};
    if (len > kSgeLength) sges.push_back(dst.At(offset + kSecondSgeOffset, std::min(len - kSgeLength, kSgeLength)));
    return sges;
  };
  // Where a WRITE, READ or atomic of `s` goes in the other side's memory: rw, the read-only region or the window.
  auto remote = [](Side& other, uint8_t choice, uint64_t* base, uint32_t* rkey) {
    switch (choice % 3) {
      case 0: *base = other.region(kRwMemory).mr.iova; *rkey = other.region(kRwMemory).mr.rkey; break;
      case 1: *base = other.region(kReadOnlyMemory).mr.iova; *rkey = other.region(kReadOnlyMemory).mr.rkey; break;
      default: *base = kMemorySpecs[kWindowMemory].iova; *rkey = other.mw_rkey; break;
    }
  };
  // A READ lands in a dst slot (up to 200 bytes), or with 0x40 in the variant anywhere in the reader's own rw region
  // (up to 4 KiB: a READ of several response packets).
  auto read_sges = [&](Side& s, uint8_t variant, uint32_t len) {
    if (variant & 0x40) return std::vector<Sge>{s.region(kRwMemory).At(0, len % 4097)};
    return dst_sges(s, len % (kSlotCapacity + 1));
  };
  auto src_sge = [](Side& s, uint32_t offset, uint32_t len) { return s.region(kSrcMemory).At(offset, len); };
  // Up to 16 KiB from src, 4 KiB per SGE (a message longer than the path's window at the small MTU).
  auto src_sges = [](Side& s, uint32_t len) {
    std::vector<Sge> sges;
    for (uint32_t done = 0; done < len || sges.empty(); done += 4096)
      sges.push_back(s.region(kSrcMemory).At(0, std::min<uint32_t>(4096, len - done)));
    return sges;
  };

  switch (static_cast<Operation>(selector % kOperationCount)) {
    case kOpRcSend: {
      const uint32_t len = p.U16() % 4097, offset = p.U8() * 8u;  // past the end of src: a local protection error
      const uint8_t variant = p.U8();
      SendWr wr;
      wr.opcode = variant % 3 == 0 ? SendOpcode::kSend : variant % 3 == 1 ? SendOpcode::kSendWithImm
                                                                           : SendOpcode::kSendWithInv;
      wr.imm_data = p.U32();
      wr.invalidate_rkey = variant & 0x80 ? o.mw_rkey : wr.imm_data;
      if (variant & 0x40) wr.flags |= send_flags::kSolicited;
      if (variant & 0x20) wr.flags |= send_flags::kFence;
      wr.sg_list = {src_sge(v, offset, len)};
      PostSend(v, (variant & 0x10) ? v.rc_srq : v.rc, std::move(wr));
      break;
    }
    case kOpRcWrite: {
      const uint32_t len = p.U16() % (4 * 4096 + 1), offset = p.U16() % 4097;
      const uint8_t variant = p.U8();
      SendWr wr;
      wr.opcode = variant & 1 ? SendOpcode::kRdmaWriteWithImm : SendOpcode::kRdmaWrite;
      remote(o, variant >> 1, &wr.remote_addr, &wr.rkey);
      wr.remote_addr += offset;
      wr.imm_data = p.U32();
      wr.sg_list = src_sges(v, len);
      PostSend(v, (variant & 0x10) ? v.rc_srq : v.rc, std::move(wr));
      break;
    }
    case kOpRcRead: {
      const uint32_t len = p.U16(), offset = p.U16() % 4097;
      const uint8_t variant = p.U8();
      SendWr wr;
      wr.opcode = SendOpcode::kRdmaRead;
      remote(o, variant, &wr.remote_addr, &wr.rkey);
      wr.remote_addr += offset;
      wr.sg_list = read_sges(v, variant, len);
      if (variant & 0x20) wr.flags |= send_flags::kFence;
      PostSend(v, (variant & 0x10) ? v.rc_srq : v.rc, std::move(wr));
      break;
    }
    case kOpRcAtomic: {
      const uint32_t offset = (p.U16() % 512) * 8;
      const uint8_t variant = p.U8();
      SendWr wr;
      wr.opcode = variant & 1 ? SendOpcode::kAtomicCmpAndSwp : SendOpcode::kAtomicFetchAndAdd;
      remote(o, variant >> 1, &wr.remote_addr, &wr.rkey);
      wr.remote_addr += offset;
      wr.compare_add = p.U32();
      wr.swap = p.U32();
      wr.sg_list = dst_sges(v, 8);
      PostSend(v, v.rc, std::move(wr));
      break;
    }
    case kOpUcPost: {
      const uint32_t len = p.U16() % (4 * 4096 + 1);
      const uint8_t variant = p.U8();
      SendWr wr;
      const bool write = variant & 1;
      wr.opcode = write ? (variant & 2 ? SendOpcode::kRdmaWriteWithImm : SendOpcode::kRdmaWrite)
                        : (variant & 2 ? SendOpcode::kSendWithImm : SendOpcode::kSend);
      wr.remote_addr = o.region(kRwMemory).mr.iova + p.U16() % 4097;
      wr.rkey = o.region(kRwMemory).mr.rkey;
      wr.sg_list = src_sges(v, len);
      PostSend(v, v.uc, std::move(wr));
      break;
    }
    case kOpUdSend: {
      const uint32_t len = p.U16() % 1400;  // above the MTU is a local length error
      const uint8_t variant = p.U8();
      SendWr wr;
      wr.opcode = variant & 1 ? SendOpcode::kSendWithImm : SendOpcode::kSend;
      wr.ah = v.ah;
      wr.remote_qpn = variant & 2 ? 0x777 : o.ud->qpn();  // nobody's, or the peer's
      wr.remote_qkey = variant & 4 ? 0x22222222 : kUdQkey;
      wr.sg_list = {src_sge(v, 0, len)};
      PostSend(v, v.ud, std::move(wr));
      break;
    }
    case kOpXrcPost: {
      const uint32_t len = p.U16() % 2049;
      const uint8_t variant = p.U8();
      SendWr wr;
      wr.remote_srqn = variant & 0x80 ? p.U32() : o.xsrq->srqn();
      switch (variant % 3) {
        case 0:
          wr.opcode = SendOpcode::kSend;
          wr.sg_list = {src_sge(v, 0, len)};
          break;
        case 1:
          wr.opcode = SendOpcode::kRdmaWrite;
          remote(o, 0, &wr.remote_addr, &wr.rkey);
          wr.sg_list = {src_sge(v, 0, len)};
          break;
        default:
          wr.opcode = SendOpcode::kRdmaRead;
          remote(o, variant >> 2, &wr.remote_addr, &wr.rkey);
          wr.sg_list = read_sges(v, variant, len);
          break;
      }
      PostSend(v, v.xrc_ini, std::move(wr));
      break;
    }
    case kOpPostRecv: {
      const uint8_t which = p.U8();
      Side& s = which & 0x80 ? o : v;
      const size_t count = p.U8() % 8 + 1;
      switch (which % 5) {
        case 0: PostRecv(s, s.rc, nullptr, count); break;
        case 1: PostRecv(s, nullptr, s.srq, count); break;
        case 2: PostRecv(s, s.uc, nullptr, count); break;
        case 3: PostRecv(s, s.ud, nullptr, count); break;
        default: PostRecv(s, nullptr, s.xsrq, count); break;
      }
      break;
    }
    case kOpPeerRc: {
      const uint8_t what = p.U8();
      const uint32_t len = p.U16() % 2049, offset = p.U16() % 4097;
      SendWr wr;
      QueuePair* qp = what & 0x80 ? o.rc_srq : o.rc;
      switch (what % 4) {
        case 0:
          wr.opcode = what & 0x40 ? SendOpcode::kSendWithInv : SendOpcode::kSend;
          wr.invalidate_rkey = v.mw_rkey;  // the victim's window is bound to its RC QP: only o.rc may invalidate it
          wr.sg_list = {src_sge(o, 0, len)};
          break;
        case 1:
          wr.opcode = what & 0x40 ? SendOpcode::kRdmaWriteWithImm : SendOpcode::kRdmaWrite;
          remote(v, what >> 2, &wr.remote_addr, &wr.rkey);
          wr.remote_addr += offset;
          wr.sg_list = {src_sge(o, 0, len)};
          break;
        case 2:
          wr.opcode = SendOpcode::kRdmaRead;
          remote(v, what >> 2, &wr.remote_addr, &wr.rkey);
          wr.remote_addr += offset;
          wr.sg_list = dst_sges(o, len % (kSlotCapacity + 1));
          break;
        default:
          wr.opcode = what & 0x40 ? SendOpcode::kAtomicCmpAndSwp : SendOpcode::kAtomicFetchAndAdd;
          remote(v, what >> 2, &wr.remote_addr, &wr.rkey);
          wr.remote_addr += (offset / 8) * 8 % 4096;
          wr.compare_add = len;
          wr.swap = offset;
          wr.sg_list = dst_sges(o, 8);
          break;
      }
      PostSend(o, qp, std::move(wr));
      break;
    }
    case kOpPeerOther: {
      const uint8_t what = p.U8();
      const uint32_t len = p.U16() % 2049;
      SendWr wr;
      wr.sg_list = {src_sge(o, 0, len)};
      switch (what % 4) {
        case 0:
          wr.opcode = what & 0x40 ? SendOpcode::kSendWithImm : SendOpcode::kSend;
          PostSend(o, o.uc, std::move(wr));
          break;
        case 1:
          wr.opcode = what & 0x40 ? SendOpcode::kRdmaWriteWithImm : SendOpcode::kRdmaWrite;
          wr.remote_addr = v.region(kRwMemory).mr.iova + p.U16() % 4097;
          wr.rkey = v.region(kRwMemory).mr.rkey;
          PostSend(o, o.uc, std::move(wr));
          break;
        case 2:
          wr.opcode = SendOpcode::kSend;
          wr.sg_list = {src_sge(o, 0, len % 1025)};
          wr.ah = o.ah;
          wr.remote_qpn = v.numbers[3];
          wr.remote_qkey = kUdQkey;
          PostSend(o, o.ud, std::move(wr));
          break;
        default:
          wr.opcode = SendOpcode::kSend;
          wr.remote_srqn = v.xsrq->srqn();
          PostSend(o, o.xrc_ini, std::move(wr));
          break;
      }
      break;
    }
    case kOpModifyQp: {
      const uint8_t which = p.U8(), to = p.U8();
      QueuePair* qp = v.qps()[which % v.qps().size()];
      if (qp == nullptr) break;
      DrainAndCheck(v);  // a QP moved to RESET takes its completions with it
      QpAttributes a;
      switch (to % 4) {
        case 0:
          a.qp_state = QpState::kErr;
          v.dev().ModifyQp(qp, a, attr::kState);
          break;
        case 1:
          a.qp_state = QpState::kSqd;
          a.en_sqd_async_notify = to & 0x80;
          v.dev().ModifyQp(qp, a, attr::kState | attr::kEnSqdAsyncNotify);
          break;
        case 2:
          a.qp_state = QpState::kRts;
          v.dev().ModifyQp(qp, a, attr::kState);
          break;
        default: {
          // Through RESET and back to RTS, towards the same peer QP, with PSNs from the input.
          a.qp_state = QpState::kReset;
          if (v.dev().ModifyQp(qp, a, attr::kState) != 0) break;
          v.ledger.Forget(qp->qpn());
          if (qp == v.ud) {
            a.qp_state = QpState::kInit;
            a.port_num = 1;
            a.qkey = kUdQkey;
            v.dev().ModifyQp(qp, a, attr::kState | attr::kPkeyIndex | attr::kPort | attr::kQkey);
            a.qp_state = QpState::kRtr;
            v.dev().ModifyQp(qp, a, attr::kState);
            a.qp_state = QpState::kRts;
            v.dev().ModifyQp(qp, a, attr::kState | attr::kSqPsn);
            break;
          }
          const uint32_t peer_qpn = qp == v.rc       ? o.rc->qpn()
                                    : qp == v.rc_srq  ? o.rc_srq->qpn()
                                    : qp == v.uc      ? o.uc->qpn()
                                    : qp == v.xrc_tgt ? o.xrc_ini->qpn()
                                                      : o.xrc_tgt->qpn();
          const uint32_t rq_psn = p.U32() & wire::kMask24, sq_psn = p.U32() & wire::kMask24;
          ConnectQp(v.dev(), qp, o.dev(), peer_qpn, rq_psn, sq_psn, qp == v.rc_srq ? kSmallMtu : kMtu);
          break;
        }
      }
      break;
    }
    case kOpCm: {
      ConnectionManager& cm = v.dev().connection_manager();
      const uint8_t what = p.U8(), which = p.U8();
      std::vector<uint32_t> ids = {listen_id_,
                                   cm_ids_.passive_established_local,
                                   cm_ids_.passive_rep_sent_local,
                                   cm_ids_.active_req_sent_local,
                                   cm_ids_.active_established_local,
                                   cm_ids_.active_dreq_sent_local};
      ids.insert(ids.end(), v.cm->ids.begin(), v.cm->ids.end());
      const uint32_t id = ids[which % ids.size()];
      const wire::IpAddress peer_addr = o.dev().config().address;
      switch (what % 9) {
        case 0: cm.SendDreq(id); break;
        case 1: cm.SendDrep(id); break;
        case 2: cm.Destroy(id); break;
        case 3: {
          static constexpr uint64_t kServices[] = {kPeerSilentService, kPeerAnswerService, kPeerNoDrepService,
                                                   kVictimService};
          uint32_t new_id = 0;
          const wire::IpAddress to = what & 0x80 ? stranger_->device->config().address
                                     : what & 0x40 ? v.dev().config().address
                                                   : peer_addr;
          if (cm.SendReq(to, MakeReq(kServices[which % 4], v.numbers[0], kVictimSendPsn), &answer_all_, &new_id) == 0 &&
              v.cm->ids.size() < 32)
            v.cm->ids.push_back(new_id);
          break;
        }
        case 4: cm.SendRtu(id, {}); break;
        case 5: cm.SendRej(id, static_cast<uint16_t>(p.U8()), {}); break;
        case 6: {
          wire::CmSidrReq req;
          req.service_id = which & 1 ? kVictimService : kPeerAnswerService;
          uint32_t new_id = 0;
          if (cm.SendSidrReq(which & 2 ? v.dev().config().address : peer_addr, req, &answer_all_, &new_id) == 0 &&
              v.cm->ids.size() < 32)
            v.cm->ids.push_back(new_id);
          break;
        }
        case 7: cm.StopListening(listen_id_); break;
        default: cm.OnPeerGone(peer_addr); break;
      }
      break;
    }
    case kOpMemory: {
      const uint8_t what = p.U8();
      // Registered again, a region gets new keys: WRs posted with the old ones fail (IBTA 10.6.3.2).
      static constexpr Memory kChangeable[] = {kRwMemory, kRecvMemory, kDstMemory};
      Region& r = v.region(kChangeable[(what >> 2) % 3]);
      switch (what % 4) {
        case 0: r.Deregister(v.dev()); break;
        case 1:
          if (!r.registered) r.Register(v.dev(), v.pd);
          break;
        case 2: BindWindow(v); break;
        default: {
          SendWr wr;
          wr.opcode = SendOpcode::kLocalInv;
          wr.invalidate_rkey = v.mw_rkey;
          PostSend(v, v.rc, std::move(wr));
          break;
        }
      }
      break;
    }
    case kOpPoll:
    case kOperationCount:
      DrainAndCheck(victim_);
      DrainAndCheck(peer_);
      break;
    case kOpDestroyQp: {
      QueuePair*& qp = v.role(p.U8());
      if (qp == nullptr) break;
      DrainAndCheck(v);
      const uint32_t qpn = qp->qpn();
      if (v.dev().DestroyQp(qp) == 0) {
        qp = nullptr;
        v.ledger.Forget(qpn);  // its work requests went with it
      }
      break;
    }
    case kOpSrq: {
      const uint8_t what = p.U8();
      SharedReceiveQueue* srq = what & 1 ? v.xsrq : v.srq;
      SrqAttributes a;
      a.srq_limit = p.U8() % (kSrqCapacity + 1);
      a.max_wr = p.U16();
      v.dev().ModifySrq(srq, a, what & 2 ? srq_attr::kMaxWr : srq_attr::kLimit);
      break;
    }
  }
}

// --- invariants -----------------------------------------------------------------------------------------------------

// Every completion: a defined status and opcode, a QP of this device, and a work request posted and not yet
// completed -- a receive WQE completes once, holding no more than its SGEs do.
void Bench::DrainAndCheck(Side& s) {
  Completion c[32];
  for (CompletionQueue* cq : {s.send_cq, s.recv_cq, s.xrc_cq}) {
    int n;
    while ((n = cq->Poll(c, 32)) > 0) {
      for (int i = 0; i < n; ++i) {
        const Completion& wc = c[i];
        FUZZ_CHECK(static_cast<uint8_t>(wc.status) <= static_cast<uint8_t>(WcStatus::kGeneralErr));
        FUZZ_CHECK(IsValidWcOpcode(wc.opcode));
        FUZZ_CHECK(s.ledger.qpns.count(wc.qp_num) == 1);
        if (wc.opcode == WcOpcode::kRecv || wc.opcode == WcOpcode::kRecvRdmaWithImm) {
          auto it = s.ledger.receives.find(wc.wr_id);
          FUZZ_CHECK(it != s.ledger.receives.end());  // a receive WQE completes once
          if (wc.status == WcStatus::kSuccess && wc.opcode == WcOpcode::kRecv)
            FUZZ_CHECK(wc.byte_len <= it->second.capacity);
          if (it->second.qpn != 0) {
            uint64_t& last = s.ledger.last_receive[it->second.qpn];
            FUZZ_CHECK(wc.wr_id > last);  // a receive queue completes in order
            last = wc.wr_id;
          }
          s.ledger.receives.erase(it);
        } else {
          auto it = s.ledger.sends.find(wc.wr_id);
          FUZZ_CHECK(it != s.ledger.sends.end());  // a send WQE completes once
          uint64_t& last = s.ledger.last_send[it->second];
          FUZZ_CHECK(wc.wr_id > last);  // a send queue completes in order
          last = wc.wr_id;
          s.ledger.sends.erase(it);
        }
      }
    }
  }
}

// What must hold whatever arrived: memory outside what may be written keeps its bytes, the counters add up, and the
// victim only ever sends well-formed packets (the peer hears from no one else).
void Bench::CheckInvariants() {
  for (Side* s : {&victim_, &peer_}) {
    for (size_t m = 0; m < s->regions.size(); ++m) {
      Region& r = s->regions[m];
      const std::vector<uint8_t>& fill = Pattern(r.storage.size(), static_cast<uint8_t>(s->seed + m * 29));
      FUZZ_CHECK(std::memcmp(r.storage.data(), fill.data(), kGuard) == 0);  // guard before
      FUZZ_CHECK(std::memcmp(r.storage.data() + kGuard + r.length(), fill.data() + kGuard + r.length(), kGuard) == 0);
      if (r.rule == Region::Rule::kImmutable) FUZZ_CHECK(std::memcmp(r.body(), r.initial.data(), r.length()) == 0);
      if (r.rule == Region::Rule::kSlots) {
        for (size_t slot = 0; slot < r.length(); slot += kSlotSize)
          for (const Gap& g : kSlotGaps)
            FUZZ_CHECK(std::memcmp(r.body() + slot + g.offset, r.initial.data() + slot + g.offset, g.length) == 0);
      }
      if (!r.registered) FUZZ_CHECK(std::memcmp(r.body(), r.frozen.data(), r.length()) == 0);
    }
    // A QP in the error state has completed every work request of its own queues, flushed if nothing else (IBTA
    // 10.3.1, 11.4.2.1), unless a CQ overflowed and lost some.
    const bool cq_lost_some = s->dev().counters().cq_overflows > 0;
    for (QueuePair* qp : s->qps()) {
      if (qp == nullptr) continue;  // destroyed
      FUZZ_CHECK(static_cast<uint8_t>(qp->state()) <= static_cast<uint8_t>(QpState::kErr));
      if (qp->state() != QpState::kErr || cq_lost_some) continue;
      for (const auto& [id, qpn] : s->ledger.sends) FUZZ_CHECK(qpn != qp->qpn());
      for (const auto& [id, r] : s->ledger.receives) FUZZ_CHECK(r.qpn != qp->qpn());
    }
    // The window towards the other side is charged with exactly what its RC and XRC requesters have in flight: one
    // that stopped sending (error, reset) must have given its packets back, or the others wait for room forever.
    Side& other = s == &victim_ ? peer_ : victim_;
    if (auto path = s->dev().path_window(other.dev().config().address)) {
      int64_t in_flight = 0;
      for (QueuePair* qp : {s->rc, s->rc_srq, s->xrc_ini}) {
        if (qp == nullptr) continue;  // destroyed: uncharged (Device::DestroyQp)
        const RcRequesterState& r = qp->requester().state();
        if (qp->state() == QpState::kRts || qp->state() == QpState::kSqd)
          in_flight += std::max(0, PsnDiff(r.sent_psn_next, r.acked_psn_next));
      }
      FUZZ_CHECK(path->in_flight() == in_flight);
    }
  }
  // Each received packet is dropped at most once by the checks every packet gets (Device::OnDatagramLocked), before
  // any transport sees it.
  const DeviceCounters c = victim_.dev().counters();
  FUZZ_CHECK(c.rx_malformed + c.rx_icrc_errors + c.rx_unknown_qp + c.rx_wrong_transport + c.rx_wrong_peer +
                 c.rx_bad_state + c.rx_bad_pkey + c.rx_cnp <=
             c.rx_packets);
  FUZZ_CHECK(c.cm.mads_received <= c.rx_packets);
  const DeviceCounters pc = peer_.dev().counters();
  FUZZ_CHECK(pc.rx_malformed == 0);
  FUZZ_CHECK(pc.rx_icrc_errors == 0);
  FUZZ_CHECK(pc.rx_wrong_peer == 0);
  FUZZ_CHECK(pc.cm.dropped_malformed == 0);
}

void Bench::Play(std::span<const uint8_t> input) {
  if (input.empty()) return;
  const uint8_t options = input[0];
  victim_answers_.req = options & kOptionReqAnswerMask;
  victim_answers_.reject_rep = options & kOptionRejectReps;
  victim_answers_.drep = !(options & kOptionIgnoreDreqs);
  victim_answers_.sidr = !(options & kOptionDropSidr);
  victim_.cm->defaults = victim_answers_;
  victim_.node->ack_timing = (options & kOptionHeldAcks) ? AckTiming::kHeld : AckTiming::kNow;
  size_t at = 1;
  for (size_t records = 0; records < kMaxRecords && at + kRecordHeaderSize <= input.size(); ++records) {
    const uint8_t flags = input[at], selector = input[at + 1];
    const size_t length = std::min<size_t>(input[at + 2] | input[at + 3] << 8, input.size() - at - kRecordHeaderSize);
    const std::span<const uint8_t> bytes = input.subspan(at + kRecordHeaderSize, length);
    at += kRecordHeaderSize + length;
    switch (flags & kRecordTypeMask) {
      case kRecordPacket: InjectPacket(flags, selector, bytes); break;
      case kRecordCmMad: InjectCmMad(flags, selector, bytes); break;
      case kRecordOperation: Operate(selector, bytes); break;
      case kRecordTime: {
        Params p(bytes);
        const uint64_t step = uint64_t{p.U16()} * ((selector & kTimeMilliseconds) ? kMs : kUs);
        const uint64_t until = fabric_.clock().NowNs() + step;
        if (selector & kTimeStall) fabric_.clock().Set(until);  // nothing moved meanwhile: the network stalled
        Pump(until);
        if (fabric_.clock().NowNs() < until) fabric_.clock().Set(until);
        Pump(until);
        break;
      }
    }
    if ((flags & kRecordTypeMask) != kRecordTime && (flags & kPumpAfter)) Pump(fabric_.clock().NowNs() + kMs);
  }
  Pump(fabric_.clock().NowNs() + kFinalPumpNs, 4 * kPumpRounds);
  CheckInvariants();
  // DEVICE_FUZZER_STATS=1: what each input did to the victim, to see what a seed reaches.
  static const bool stats = std::getenv("DEVICE_FUZZER_STATS") != nullptr;
  if (stats) {
    std::fprintf(stderr, "--- peer\n%s", FormatCounters(peer_.dev().counters()).c_str());
    std::fprintf(stderr, "clock %.3f ms\n", fabric_.clock().NowNs() / 1e6);
    std::fprintf(stderr, "--- victim\n%s", FormatCounters(victim_.dev().counters()).c_str());
    ConnectionManager& cm = victim_.dev().connection_manager();
    std::fprintf(stderr, "cm states: %s %s %s %s %s\n", ToString(cm.State(cm_ids_.passive_established_local)),
                 ToString(cm.State(cm_ids_.passive_rep_sent_local)), ToString(cm.State(cm_ids_.active_req_sent_local)),
                 ToString(cm.State(cm_ids_.active_established_local)),
                 ToString(cm.State(cm_ids_.active_dreq_sent_local)));
    for (QueuePair* qp : victim_.qps())
      if (qp != nullptr) std::fprintf(stderr, "qp 0x%x %s\n", qp->qpn(), std::string(ToString(qp->state())).c_str());
  }
}

LiveNumbers Bench::Describe() {
  LiveNumbers n = cm_ids_;
  const Side& v = victim_;
  n.rc_qpn = v.rc->qpn();
  n.rc_on_srq_qpn = v.rc_srq->qpn();
  n.uc_qpn = v.uc->qpn();
  n.ud_qpn = v.ud->qpn();
  n.xrc_target_qpn = v.xrc_tgt->qpn();
  n.xrc_initiator_qpn = v.xrc_ini->qpn();
  n.peer_rc_qpn = peer_.rc->qpn();
  n.peer_ud_qpn = peer_.ud->qpn();
  n.peer_xrc_initiator_qpn = peer_.xrc_ini->qpn();
  n.xrc_srqn = v.xsrq->srqn();
  n.ud_qkey = kUdQkey;
  n.rc_rq_psn = v.rc->attributes().rq_psn;
  n.uc_rq_psn = v.uc->attributes().rq_psn;
  n.xrc_rq_psn = v.xrc_tgt->attributes().rq_psn;
  n.rc_sq_psn = v.rc->attributes().sq_psn;
  for (size_t m = 0; m < kMemoryCount; ++m) {
    n.iova[m] = kMemorySpecs[m].iova;
    n.length[m] = kMemorySpecs[m].length;
    n.rkey[m] = m == kWindowMemory ? v.mw_rkey : v.regions[m].mr.rkey;
  }
  n.victim_guid = victim_.node->device->config().node_guid;
  n.peer_guid = peer_.node->device->config().node_guid;
  n.listen_service = kVictimService;
  return n;
}

}  // namespace

LiveNumbers DescribeBench() {
  Bench bench;
  return bench.Describe();
}

std::vector<uint8_t> Record(uint8_t flags, uint8_t selector, std::span<const uint8_t> bytes) {
  std::vector<uint8_t> out{flags, selector, static_cast<uint8_t>(bytes.size()), static_cast<uint8_t>(bytes.size() >> 8)};
  out.insert(out.end(), bytes.begin(), bytes.end());
  return out;
}

}  // namespace uroce::emu::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uroce::emu::fuzz::Bench bench;
  bench.Play(std::span<const uint8_t>(data, size));
  return 0;
}
