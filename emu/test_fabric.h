// A deterministic test bench for the HCA: several Devices joined by a SimNetwork, driven by a ManualClock, with a
// pump that delivers every queued datagram and fires every timer until the network is quiet. Also a few helpers that
// build objects the way a verbs program does, so protocol tests read like RDMA programs.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "emu/device.h"
#include "wire/clock.h"
#include "wire/packet.h"
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
  void Wake() override {
    ++wakes_;
    inner_->Wake();
  }
  void SetReceiveArmed(bool armed) override { inner_->SetReceiveArmed(armed); }
  uint64_t sent() const { return index_; }
  uint64_t wakes() const { return wakes_; }  // Wake() calls: how often the device interrupted its poller
  size_t largest_batch() const { return largest_batch_; }  // the most datagrams handed over in one Send

  // What the node offered to the network, for tests that inspect packets on the wire (off unless `record`).
  struct Sent {
    uint64_t index = 0;
    uint64_t time_ns = 0;  // the clock when sent (0 without a clock)
    bool dropped = false;  // removed by drop_if
    wire::UdpEndpoint dst;
    std::vector<uint8_t> bytes;
    wire::IpAddress src;  // the local address it left from (OutDatagram::src_addr)
    // The parsed packet (views into `bytes`); nullopt if it does not parse.
    std::optional<wire::PacketView> Parse() const;
  };
  bool record = false;
  const wire::Clock* clock = nullptr;  // stamps Sent::time_ns (Fabric::AddNode sets it)
  const std::vector<Sent>& log() const { return log_; }
  void ClearLog() { log_.clear(); }

 private:
  std::unique_ptr<wire::Transport> inner_;
  uint64_t index_ = 0;
  std::atomic<uint64_t> wakes_{0};
  size_t largest_batch_ = 0;
  std::vector<Sent> log_;
};

struct Node {
  std::unique_ptr<ScriptedTransport> transport;
  std::unique_ptr<Device> device;
  std::vector<AsyncEvent> events;
  Device::AckTiming ack_timing = Device::AckTiming::kNow;  // how the fabric delivers to this node
};

class Fabric {
 public:
  // `defaults` is every node's DeviceConfig but for the address, MTU and GUID AddNode gives it.
  explicit Fabric(DeviceConfig defaults = {}) : defaults_(std::move(defaults)), network_(clock_) {}
  // Adds a device at 10.0.0.<n+1>:4791 on the simulated network (an in-memory address, never a socket), with `more`
  // addresses of its host after it in its GID table (entries 1, 2, ...).
  Node& AddNode(Mtu mtu = Mtu::k4096, std::span<const wire::IpAddress> more = {});
  // If set, changes the configuration of node `index` (0-based) before AddNode makes its device.
  std::function<void(size_t index, DeviceConfig& config)> configure_node;
  wire::SimNetwork& network() { return network_; }
  wire::ManualClock& clock() { return clock_; }
  // Delivers datagrams and runs timers until nothing is in flight; returns the number of datagrams delivered.
  int Pump(int max_rounds = 100000);
  // Like Pump, but never moves the clock past `deadline_ns`: returns when quiet or when the next event lies beyond
  // it (for protocols that retry forever). Returns the number of datagrams delivered.
  int PumpUntil(uint64_t deadline_ns, int max_rounds = 100000);
  // One round: delivers what is due, runs timers, and when nothing was delivered moves the clock to the next event.
  // Returns false when nothing is in flight and no timer is pending (quiet).
  bool Step();
  // Sends a crafted packet from `from` to `to` (ICRC sealed for the real flow), bypassing its device.
  void Inject(Node& from, const Node& to, const wire::PacketSpec& spec, std::span<const uint8_t> payload = {});

 private:
  bool StepUntil(uint64_t deadline_ns);

  DeviceConfig defaults_;
  wire::ManualClock clock_{1'000'000};
  int last_delivered_ = 0;
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

// The RC attributes Connect() sets (ibv_modify_qp(3) meanings); ConnectRc takes others.
struct RcAttributes {
  uint8_t timeout = 14;        // local ACK timeout 4.096 us << timeout (0: none)
  uint8_t retry_cnt = 7;       // 7 retries (infinite only with DeviceConfig::retry_cnt_7_infinite)
  uint8_t rnr_retry = 7;       // 7: infinite
  uint8_t min_rnr_timer = 12;  // 0.64 ms (IBTA table 45)
  uint8_t max_rd_atomic = 1;
  uint8_t max_dest_rd_atomic = 1;
  uint32_t access = 0;         // qp_access_flags
};
void ConnectRc(Device& dev, QueuePair* qp, const Device& peer, uint32_t peer_qpn, const RcAttributes& rc);

// Two nodes, each with a PD, a send CQ, a receive CQ and an RC QP connected to the other's.
struct RcPair {
  Fabric fabric;
  Node *a, *b;
  ProtectionDomain *pa, *pb;
  CompletionQueue *sa, *ra, *sb, *rb;  // send / receive CQ of a and b
  QueuePair *qa, *qb;

  // `rc_a` are qa's attributes, `rc_b` qb's (access flags included).
  RcPair(Mtu mtu, const RcAttributes& rc_a, const RcAttributes& rc_b, QpCapabilities cap = {64, 64, 4, 4, 0},
         uint32_t cq_capacity = 1024, DeviceConfig device_defaults = {});
  explicit RcPair(Mtu mtu = Mtu::k1024, uint32_t access = access::kRemoteWrite | access::kRemoteRead |
                                                           access::kRemoteAtomic);
};

std::vector<Completion> Drain(CompletionQueue* cq);
// Hands `device` what other processes of its host wrote into its ring (records of `kind`, oldest first), as its
// polling thread would, and empties `ring`.
void DeliverRing(Device& device, wire::RingRecord kind, std::vector<std::vector<uint8_t>>& ring);

// A ScriptedTransport::drop_if that drops packets by what they are -- their BTH (PSN, opcode, destination QP) -- not
// by their place in the node's send order, which batching, ACK coalescing and held ACKs change: the first `times`
// packets `match` accepts are dropped (each retransmission of a matched packet counts again).
using DropRule = std::function<bool(uint64_t index, std::span<const uint8_t> payload)>;
DropRule DropFirst(int times, std::function<bool(const wire::PacketView& p)> match);
// The first sending of PSN `psn` (of any QP of the node), optionally only with opcode `opcode`.
DropRule DropPsn(uint32_t psn, std::optional<uint8_t> opcode = std::nullopt);
// The first sending of each PSN in [first, end).
DropRule DropPsns(uint32_t first, uint32_t end);

}  // namespace uroce::emu::testing
