// A deterministic test bench for the HCA: several Devices joined by a SimNetwork, driven by a ManualClock, with a
// pump that delivers every queued datagram and fires every timer until the network is quiet. Also a few helpers that
// build objects the way a verbs program does, so protocol tests read like RDMA programs.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "emu/device.h"
#include "wire/clock.h"
#include "wire/sim_network.h"

namespace uroce::emu::testing {

// Wraps a transport and lets a test drop or alter chosen outgoing datagrams by their index (0-based, per node).
class ScriptedTransport final : public wire::Transport {
 public:
  explicit ScriptedTransport(std::unique_ptr<wire::Transport> inner) : inner_(std::move(inner)) {}
  // Returns true to drop the datagram with this index.
  std::function<bool(uint64_t index, std::span<const uint8_t> payload)> drop_if;

  wire::UdpEndpoint local() const override { return inner_->local(); }
  wire::Flow OutgoingFlow(const wire::UdpEndpoint& dst, uint16_t src_port) const override {
    return inner_->OutgoingFlow(dst, src_port);
  }
  int Send(std::span<const wire::OutDatagram> batch) override;
  int Poll(const wire::DatagramHandler& handler, int64_t timeout_ns) override { return inner_->Poll(handler, timeout_ns); }
  void Wake() override { inner_->Wake(); }
  uint64_t sent() const { return index_; }

 private:
  std::unique_ptr<wire::Transport> inner_;
  uint64_t index_ = 0;
};

struct Node {
  std::unique_ptr<ScriptedTransport> transport;
  std::unique_ptr<Device> device;
  std::vector<AsyncEvent> events;
};

class Fabric {
 public:
  Fabric() : network_(clock_) {}
  // Adds a device at 10.0.0.<n+1>:4791 on the simulated network (an in-memory address, never a socket).
  Node& AddNode(Mtu mtu = Mtu::k4096);
  wire::SimNetwork& network() { return network_; }
  wire::ManualClock& clock() { return clock_; }
  // Delivers datagrams and runs timers until nothing is in flight; returns the number of datagrams delivered.
  int Pump(int max_rounds = 100000);

 private:
  wire::ManualClock clock_{1'000'000};
  wire::SimNetwork network_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

// A registered buffer.
struct Buffer {
  std::vector<uint8_t> bytes;
  MemoryRegion mr;
  emu::Sge At(uint64_t offset, uint32_t length) const { return {mr.iova + offset, length, mr.lkey}; }
};
Buffer Register(Device& dev, ProtectionDomain* pd, size_t size, uint32_t access);

// Creates a QP and moves it through INIT, RTR to RTS with the attributes each transition needs.
QueuePair* CreateConnectedQp(Device& dev, QpType type, ProtectionDomain* pd, CompletionQueue* cq,
                             const Device* peer_device, uint32_t peer_qpn, uint32_t access = 0);
// RESET -> RTS for a UD QP with `qkey`.
QueuePair* CreateUdQp(Device& dev, ProtectionDomain* pd, CompletionQueue* cq, uint32_t qkey);
// Second half of connecting: tell `qp` (already RTS-capable) which remote QPN it talks to, for pairs created before
// the peer's number was known.
void Connect(Device& dev, QueuePair* qp, const Device& peer, uint32_t peer_qpn, uint32_t access = 0);

std::vector<Completion> Drain(CompletionQueue* cq);

}  // namespace uroce::emu::testing
