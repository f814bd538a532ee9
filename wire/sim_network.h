// SimNetwork: an in-memory datagram network joining many Transport endpoints, deterministic by construction. Every
// directed link (sending endpoint -> destination endpoint) has its own FaultModel and packet counter, so what happens
// to a datagram depends only on the link's seed and the order of sends; delivery times come from the injected Clock.
// A test drives it with a ManualClock (advance to NextDeliveryNs(), Poll with timeout 0); multi-threaded tests use
// SystemClock, where a blocking Poll sleeps on a condition variable until a datagram is due, the timeout, or Wake().
// Poll's timeout is always real time; with a ManualClock a blocking Poll wakes on sends and Wake() only (a datagram
// delayed into the future becomes due when the driver moves the clock and polls again).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "wire/address.h"
#include "wire/clock.h"
#include "wire/fault_model.h"
#include "wire/transport.h"

namespace uroce::wire {

struct SimTraceEvent {
  enum class Kind { kSent, kUnroutable, kDelivered };
  Kind kind = Kind::kSent;
  uint64_t time_ns = 0;      // send time (kSent, kUnroutable) or delivery time (kDelivered)
  UdpEndpoint from;          // kSent/kUnroutable: the sending transport's endpoint; kDelivered: the source as received
  UdpEndpoint to;            // destination endpoint
  uint64_t link_index = 0;   // the datagram's index on its link (FaultModel packet_index)
  int copy = 0;              // kDelivered: 0 or 1 (second copy of a duplicate)
  FaultDecision decision;    // kSent: what the link's FaultModel decided
  size_t payload_len = 0;
  uint64_t payload_hash = 0;  // FNV-1a 64 of the payload as sent (kSent) or as delivered (kDelivered)

  std::string ToString() const;
  bool operator==(const SimTraceEvent&) const = default;
};

class SimNetwork {
 public:
  // `clock` must outlive the network and every transport attached to it.
  explicit SimNetwork(const Clock& clock);
  ~SimNetwork();
  SimNetwork(const SimNetwork&) = delete;
  SimNetwork& operator=(const SimNetwork&) = delete;

  // A transport receiving at `local`, and at the same port of each address of `more` (a host with several addresses, as
  // a socket bound to the wildcard receives); nullptr if one of those endpoints is taken. Port 0 picks a port free on
  // all from 49152 up. It sends from local.addr, or from another of its addresses that OutDatagram::src_addr names
  // (any other address is unroutable). Destroying the transport frees its endpoints and discards what was queued for
  // it. Transports may outlive the SimNetwork object (they share its state).
  std::unique_ptr<Transport> Attach(const UdpEndpoint& local, std::span<const IpAddress> more = {});

  // Faults for datagrams sent by the transport at `from` to `to` (one direction). Keeps the link's packet counter
  // and counters; the stream id of the link's FaultModel is FaultStreamId(from, to).
  void SetFaults(const UdpEndpoint& from, const UdpEndpoint& to, const FaultConfig& config);
  // Faults for every link without its own SetFaults (including links already used).
  void SetDefaultFaults(const FaultConfig& config);

  // Earliest delivery time of any queued datagram, to advance a ManualClock to.
  std::optional<uint64_t> NextDeliveryNs() const;

  FaultCounters counters(const UdpEndpoint& from, const UdpEndpoint& to) const;
  FaultCounters total_counters() const;
  uint64_t unroutable() const;  // datagrams sent to an endpoint nobody is attached to (silently dropped)

  // Records every send and delivery while enabled (off by default).
  void EnableTrace(bool on);
  std::vector<SimTraceEvent> trace() const;

  struct State;  // shared with the attached transports

 private:
  std::shared_ptr<State> state_;
};

// FNV-1a, 64 bit: the payload fingerprint used in traces.
uint64_t Fnv1a64(std::span<const uint8_t> bytes);

}  // namespace uroce::wire
