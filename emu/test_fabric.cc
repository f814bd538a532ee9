#include "emu/test_fabric.h"

#include <memory>

#include <algorithm>

#include <gtest/gtest.h>

#include "wire/frame.h"
#include "wire/icrc.h"

namespace uroce::emu::testing {

std::optional<wire::PacketView> ScriptedTransport::Sent::Parse() const {
  auto p = wire::ParsePacket(bytes);
  if (!p) return std::nullopt;
  return *p;
}

int ScriptedTransport::Send(std::span<const wire::OutDatagram> batch) {
  std::vector<wire::OutDatagram> kept;
  largest_batch_ = std::max(largest_batch_, batch.size());
  for (const auto& d : batch) {
    const uint64_t i = index_++;
    const bool drop = drop_if && drop_if(i, d.payload);
    if (record) {
      log_.push_back(Sent{i, clock ? clock->NowNs() : 0, drop, d.dst,
                          std::vector<uint8_t>(d.payload.begin(), d.payload.end()), d.src_addr});
    }
    if (drop) continue;
    kept.push_back(d);
  }
  if (!kept.empty()) {
    const int n = inner_->Send(kept);
    if (n < 0) return n;
  }
  return static_cast<int>(batch.size());
}

Node& Fabric::AddNode(Mtu mtu, std::span<const wire::IpAddress> more) {
  auto node = std::make_unique<Node>();
  const wire::UdpEndpoint ep{wire::IpAddress::V4(0x0a000001 + static_cast<uint32_t>(nodes_.size())),
                             wire::kRoceV2UdpPort};
  node->transport = std::make_unique<ScriptedTransport>(network_.Attach(ep, more));
  node->transport->clock = &clock_;
  DeviceConfig cfg = defaults_;
  cfg.address = ep.addr;
  cfg.active_mtu = mtu;
  cfg.node_guid = 0x0200'5eff'fe00'0000ull + nodes_.size();
  if (configure_node) configure_node(nodes_.size(), cfg);
  node->device = std::make_unique<Device>(cfg, *node->transport, clock_);
  Node* raw = node.get();
  node->device->set_async_handler([raw](const AsyncEvent& e) { raw->events.push_back(e); });
  if (!more.empty()) node->device->UpdateGids(more);
  nodes_.push_back(std::move(node));
  return *raw;
}

bool Fabric::Step() { return StepUntil(0); }

// One round of Pump; `deadline_ns` (0: none) bounds how far the clock may move. False when quiet or blocked by the
// deadline.
bool Fabric::StepUntil(uint64_t deadline_ns) {
  int n = 0;
  for (auto& node : nodes_) {
    Device* dev = node->device.get();
    const Device::AckTiming acks = node->ack_timing;
    n += node->transport->Poll([dev, acks](const wire::InDatagram& d) { dev->OnDatagram(d, acks); }, 0);
  }
  uint64_t next_timer = 0;
  for (auto& node : nodes_) {
    next_timer = wire::EarlierDeadline(next_timer, node->device->RunTimers());
  }
  last_delivered_ = n;
  if (n > 0) return true;
  auto next = network_.NextDeliveryNs();
  const uint64_t target = wire::EarlierDeadline(next ? *next : 0, next_timer);
  if (target == 0) return false;
  if (deadline_ns != 0 && target > deadline_ns) return false;
  if (target > clock_.NowNs()) clock_.Set(target);
  return true;
}

int Fabric::Pump(int max_rounds) {
  int delivered = 0;
  for (int round = 0; round < max_rounds; ++round) {
    const bool more = StepUntil(0);
    delivered += last_delivered_;
    if (!more) return delivered;
  }
  ADD_FAILURE() << "network did not go quiet in " << max_rounds << " rounds";
  return delivered;
}

int Fabric::PumpUntil(uint64_t deadline_ns, int max_rounds) {
  int delivered = 0;
  for (int round = 0; round < max_rounds; ++round) {
    const bool more = StepUntil(deadline_ns);
    delivered += last_delivered_;
    if (!more) return delivered;
  }
  ADD_FAILURE() << "network did not go quiet in " << max_rounds << " rounds";
  return delivered;
}

void Fabric::Inject(Node& from, const Node& to, const wire::PacketSpec& spec, std::span<const uint8_t> payload) {
  const wire::UdpEndpoint dst{to.device->config().address, wire::kRoceV2UdpPort};
  const uint16_t sport = wire::kRoceSourcePortMin;
  std::vector<uint8_t> bytes(wire::EncodedLength(spec, payload.size()));
  auto n = wire::EncodePacket(spec, payload, bytes);
  ASSERT_TRUE(n.has_value());
  wire::SealIcrc(from.transport->OutgoingFlow(dst, sport), bytes);
  const wire::OutDatagram d{dst, sport, bytes};
  ASSERT_EQ(from.transport->Send(std::span(&d, 1)), 1);
}

Buffer Register(Device& dev, ProtectionDomain* pd, size_t size, uint32_t access) {
  Buffer b;
  b.bytes.assign(size, 0);
  EXPECT_EQ(dev.RegisterMr(pd, b.bytes.data(), size, reinterpret_cast<uint64_t>(b.bytes.data()), access, &b.mr), 0);
  return b;
}

namespace {
QueuePair* CreateReset(Device& dev, QpType type, ProtectionDomain* pd, CompletionQueue* cq) {
  QpInitAttributes init;
  init.type = type;
  init.pd = pd;
  init.send_cq = init.recv_cq = cq;
  init.cap = {64, 64, 4, 4, 0};
  QueuePair* qp = nullptr;
  EXPECT_EQ(dev.CreateQp(init, &qp), 0);
  return qp;
}
}  // namespace

namespace {
void ConnectWith(Device& dev, QueuePair* qp, const Device& peer, uint32_t peer_qpn, const RcAttributes& rc) {
  QpAttributes a;
  a.qp_state = QpState::kInit;
  a.port_num = 1;
  a.pkey_index = 0;
  a.qp_access_flags = rc.access;
  ASSERT_EQ(dev.ModifyQp(qp, a, attr::kState | attr::kPkeyIndex | attr::kPort | attr::kAccessFlags), 0);
  a.qp_state = QpState::kRtr;
  a.path_mtu = dev.config().active_mtu;
  a.dest_qp_num = peer_qpn;
  a.rq_psn = 0;
  a.ah_attr.dgid = peer.config().address.bytes();
  a.ah_attr.is_global = true;
  a.ah_attr.port_num = 1;
  uint32_t mask = attr::kState | attr::kAv | attr::kPathMtu | attr::kDestQpn | attr::kRqPsn;
  if (qp->type() == QpType::kRc) {
    a.max_dest_rd_atomic = rc.max_dest_rd_atomic;
    a.min_rnr_timer = rc.min_rnr_timer;
    mask |= attr::kMaxDestRdAtomic | attr::kMinRnrTimer;
  }
  ASSERT_EQ(dev.ModifyQp(qp, a, mask), 0);
  a.qp_state = QpState::kRts;
  a.sq_psn = 0;
  mask = attr::kState | attr::kSqPsn;
  if (qp->type() == QpType::kRc) {
    a.timeout = rc.timeout;
    a.retry_cnt = rc.retry_cnt;
    a.rnr_retry = rc.rnr_retry;
    a.max_rd_atomic = rc.max_rd_atomic;
    mask |= attr::kTimeout | attr::kRetryCnt | attr::kRnrRetry | attr::kMaxQpRdAtomic;
  }
  ASSERT_EQ(dev.ModifyQp(qp, a, mask), 0);
}
}  // namespace

void Connect(Device& dev, QueuePair* qp, const Device& peer, uint32_t peer_qpn, uint32_t access) {
  RcAttributes rc;
  rc.access = access;
  ConnectWith(dev, qp, peer, peer_qpn, rc);
}

void ConnectRc(Device& dev, QueuePair* qp, const Device& peer, uint32_t peer_qpn, const RcAttributes& rc) {
  ConnectWith(dev, qp, peer, peer_qpn, rc);
}

RcPair::RcPair(Mtu mtu, const RcAttributes& rc_a, const RcAttributes& rc_b, QpCapabilities cap,
               uint32_t cq_capacity, DeviceConfig device_defaults)
    : fabric(std::move(device_defaults)) {
  a = &fabric.AddNode(mtu);
  b = &fabric.AddNode(mtu);
  pa = a->device->AllocPd();
  pb = b->device->AllocPd();
  EXPECT_EQ(a->device->CreateCq(cq_capacity, &sa), 0);
  EXPECT_EQ(a->device->CreateCq(cq_capacity, &ra), 0);
  EXPECT_EQ(b->device->CreateCq(cq_capacity, &sb), 0);
  EXPECT_EQ(b->device->CreateCq(cq_capacity, &rb), 0);
  QpInitAttributes init;
  init.type = QpType::kRc;
  init.cap = cap;
  init.pd = pa;
  init.send_cq = sa;
  init.recv_cq = ra;
  EXPECT_EQ(a->device->CreateQp(init, &qa), 0);
  init.cap = cap;
  init.pd = pb;
  init.send_cq = sb;
  init.recv_cq = rb;
  EXPECT_EQ(b->device->CreateQp(init, &qb), 0);
  ConnectRc(*a->device, qa, *b->device, qb->qpn(), rc_a);
  ConnectRc(*b->device, qb, *a->device, qa->qpn(), rc_b);
}

namespace {
RcAttributes WithAccess(uint32_t access) {
  RcAttributes rc;
  rc.access = access;
  return rc;
}
}  // namespace

RcPair::RcPair(Mtu mtu, uint32_t access) : RcPair(mtu, WithAccess(access), WithAccess(access)) {}

QueuePair* CreateConnectedQp(Device& dev, QpType type, ProtectionDomain* pd, CompletionQueue* cq,
                             const Device* peer_device, uint32_t peer_qpn, uint32_t access) {
  QueuePair* qp = CreateReset(dev, type, pd, cq);
  if (qp && peer_device) Connect(dev, qp, *peer_device, peer_qpn, access);
  return qp;
}

QueuePair* CreateUdQp(Device& dev, ProtectionDomain* pd, CompletionQueue* cq, uint32_t qkey) {
  QueuePair* qp = CreateReset(dev, QpType::kUd, pd, cq);
  QpAttributes a;
  a.qp_state = QpState::kInit;
  a.port_num = 1;
  a.qkey = qkey;
  EXPECT_EQ(dev.ModifyQp(qp, a, attr::kState | attr::kPkeyIndex | attr::kPort | attr::kQkey), 0);
  a.qp_state = QpState::kRtr;
  EXPECT_EQ(dev.ModifyQp(qp, a, attr::kState), 0);
  a.qp_state = QpState::kRts;
  a.sq_psn = 0;
  EXPECT_EQ(dev.ModifyQp(qp, a, attr::kState | attr::kSqPsn), 0);
  return qp;
}

void DeliverRing(Device& device, wire::RingRecord kind, std::vector<std::vector<uint8_t>>& ring) {
  for (const auto& record : ring) {
    wire::InDatagram d;
    d.record = kind;
    d.payload = record;
    device.OnDatagram(d, Device::AckTiming::kNow);
  }
  ring.clear();
}

std::vector<Completion> Drain(CompletionQueue* cq) {
  std::vector<Completion> out;
  Completion c[16];
  int n;
  while ((n = cq->Poll(c, 16)) > 0) out.insert(out.end(), c, c + n);
  return out;
}

DropRule DropFirst(int times, std::function<bool(const wire::PacketView& p)> match) {
  auto left = std::make_shared<int>(times);
  return [left, match = std::move(match)](uint64_t, std::span<const uint8_t> payload) {
    if (*left <= 0) return false;
    const auto p = wire::ParsePacket(payload);
    if (!p || !match(*p)) return false;
    --*left;
    return true;
  };
}

DropRule DropPsn(uint32_t psn, std::optional<uint8_t> opcode) {
  return DropFirst(1, [psn, opcode](const wire::PacketView& p) {
    return p.bth.psn == psn && (!opcode || p.bth.opcode == *opcode);
  });
}

DropRule DropPsns(uint32_t first, uint32_t end) {
  auto seen = std::make_shared<std::vector<bool>>(end - first);
  return [first, end, seen](uint64_t, std::span<const uint8_t> payload) -> bool {
    const auto p = wire::ParsePacket(payload);
    if (!p || p->bth.psn < first || p->bth.psn >= end || (*seen)[p->bth.psn - first]) return false;
    (*seen)[p->bth.psn - first] = true;
    return true;
  };
}

}  // namespace uroce::emu::testing
