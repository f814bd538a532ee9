#include "emu/test_fabric.h"

#include <gtest/gtest.h>

namespace uroce::emu::testing {

int ScriptedTransport::Send(std::span<const wire::OutDatagram> batch) {
  std::vector<wire::OutDatagram> kept;
  for (const auto& d : batch) {
    const uint64_t i = index_++;
    if (drop_if && drop_if(i, d.payload)) continue;
    kept.push_back(d);
  }
  if (!kept.empty()) {
    const int n = inner_->Send(kept);
    if (n < 0) return n;
  }
  return static_cast<int>(batch.size());
}

Node& Fabric::AddNode(Mtu mtu) {
  auto node = std::make_unique<Node>();
  const wire::UdpEndpoint ep{wire::IpAddress::V4(0x0a000001 + static_cast<uint32_t>(nodes_.size())),
                             wire::kRoceV2UdpPort};
  node->transport = std::make_unique<ScriptedTransport>(network_.Attach(ep));
  DeviceConfig cfg;
  cfg.address = ep.addr;
  cfg.active_mtu = mtu;
  cfg.node_guid = 0x0200'5eff'fe00'0000ull + nodes_.size();
  node->device = std::make_unique<Device>(cfg, *node->transport, clock_);
  Node* raw = node.get();
  node->device->set_async_handler([raw](const AsyncEvent& e) { raw->events.push_back(e); });
  nodes_.push_back(std::move(node));
  return *raw;
}

int Fabric::Pump(int max_rounds) {
  int delivered = 0;
  for (int round = 0; round < max_rounds; ++round) {
    int n = 0;
    for (auto& node : nodes_) {
      Device* dev = node->device.get();
      n += node->transport->Poll([dev](const wire::InDatagram& d) { dev->OnDatagram(d); }, 0);
    }
    uint64_t next_timer = 0;
    for (auto& node : nodes_) {
      const uint64_t t = node->device->RunTimers();
      if (t != 0 && (next_timer == 0 || t < next_timer)) next_timer = t;
    }
    delivered += n;
    if (n > 0) continue;
    auto next = network_.NextDeliveryNs();
    uint64_t target = next ? *next : 0;
    if (next_timer != 0 && (target == 0 || next_timer < target)) target = next_timer;
    if (target == 0) return delivered;
    if (target > clock_.NowNs()) clock_.Set(target);
  }
  ADD_FAILURE() << "network did not go quiet in " << max_rounds << " rounds";
  return delivered;
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

void Connect(Device& dev, QueuePair* qp, const Device& peer, uint32_t peer_qpn, uint32_t access) {
  QpAttributes a;
  a.qp_state = QpState::kInit;
  a.port_num = 1;
  a.pkey_index = 0;
  a.qp_access_flags = access;
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
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    mask |= attr::kMaxDestRdAtomic | attr::kMinRnrTimer;
  }
  ASSERT_EQ(dev.ModifyQp(qp, a, mask), 0);
  a.qp_state = QpState::kRts;
  a.sq_psn = 0;
  mask = attr::kState | attr::kSqPsn;
  if (qp->type() == QpType::kRc) {
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    mask |= attr::kTimeout | attr::kRetryCnt | attr::kRnrRetry | attr::kMaxQpRdAtomic;
  }
  ASSERT_EQ(dev.ModifyQp(qp, a, mask), 0);
}

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

std::vector<Completion> Drain(CompletionQueue* cq) {
  std::vector<Completion> out;
  Completion c[16];
  int n;
  while ((n = cq->Poll(c, 16)) > 0) out.insert(out.end(), c, c + n);
  return out;
}

}  // namespace uroce::emu::testing
