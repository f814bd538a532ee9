// FaultInjectingTransport: a decorator that applies a FaultModel to the datagrams any Transport sends (and, with a
// second configuration, to those it receives): drops, duplicates, one flipped bit (on a copy: the caller's buffer is
// never modified), delay, and reordering (a reordered datagram is held back reorder_delay_ns longer than the others,
// so datagrams sent after it overtake it). Held datagrams are released, in (release time, send order), from Send and
// Poll calls; Poll shortens its wait on the inner transport to the next release time.
//
// The send model is FaultModel(send_faults, stream_id) indexed by the count of datagrams this decorator has accepted;
// the receive model is FaultModel(receive_faults, stream_id + 1) indexed by datagrams received from the inner
// transport, so a test recomputes every decision.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "wire/clock.h"
#include "wire/fault_model.h"
#include "wire/transport.h"

namespace uroce::wire {

class FaultInjectingTransport final : public Transport {
 public:
  // `clock` must outlive this object.
  FaultInjectingTransport(std::unique_ptr<Transport> inner, const Clock& clock, const FaultConfig& send_faults,
                          const FaultConfig& receive_faults = FaultConfig{}, uint64_t stream_id = 0);
  ~FaultInjectingTransport() override;  // held datagrams are lost, as on a real network

  UdpEndpoint local() const override { return inner_->local(); }
  Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t src_port) const override {
    return inner_->OutgoingFlow(dst, src_port);
  }
  // Returns how many of `batch` were accepted (dropped and held ones count as accepted). When the inner transport
  // takes fewer, the rest are not counted and get the same fault decisions when retried.
  int Send(std::span<const OutDatagram> batch) override;
  int Poll(const DatagramHandler& handler, int64_t timeout_ns) override;
  void Wake() override;
  void SetReceiveArmed(bool armed) override { inner_->SetReceiveArmed(armed); }

  FaultCounters send_counters() const;
  FaultCounters receive_counters() const;
  // Earliest release time of a held datagram (either direction), on the decorator's clock.
  std::optional<uint64_t> NextReleaseNs() const;
  size_t held_sends() const;
  size_t held_receives() const;
  const FaultModel& send_model() const { return send_model_; }
  const FaultModel& receive_model() const { return receive_model_; }
  Transport& inner() { return *inner_; }

 private:
  struct HeldSend {
    UdpEndpoint dst;
    uint16_t src_port;
    std::vector<uint8_t> payload;
    bool has_icrc = true;
    bool altered = false;
    IpAddress src_addr;
  };
  struct HeldReceive {
    UdpEndpoint src;
    UdpEndpoint dst;
    std::optional<uint16_t> ip_id;
    std::vector<uint8_t> payload;
    bool icrc_vouched = false;
  };

  void ReleaseDueSendsLocked(uint64_t now);
  int DeliverDueReceives(const DatagramHandler& handler);

  std::unique_ptr<Transport> inner_;
  const Clock& clock_;
  const FaultModel send_model_;
  const FaultModel receive_model_;

  mutable std::mutex send_mu_;
  uint64_t send_index_ = 0;
  uint64_t send_seq_ = 0;
  FaultCounters send_counters_;
  std::map<std::pair<uint64_t, uint64_t>, HeldSend> held_sends_;  // key: (release time, sequence)

  mutable std::mutex receive_mu_;  // receive state is written by the polling thread only; others read counters
  uint64_t receive_index_ = 0;
  uint64_t receive_seq_ = 0;
  FaultCounters receive_counters_;
  std::map<std::pair<uint64_t, uint64_t>, HeldReceive> held_receives_;

  std::atomic<bool> woken_{false};
};

}  // namespace uroce::wire
