#include "wire/sim_network.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <utility>

namespace uroce::wire {

namespace {

struct Queued {
  UdpEndpoint src;  // as the receiver sees it (sender address, wanted source port)
  UdpEndpoint dst;  // the endpoint it was sent to (a transport may receive at several addresses)
  std::vector<uint8_t> payload;
  uint64_t link_index = 0;  // for trace records
  int copy = 0;
};

// One attached endpoint: its receive queue ordered by (delivery time, global send sequence).
struct Port {
  std::map<std::pair<uint64_t, uint64_t>, Queued> queue;
  std::condition_variable cv;
  bool wake = false;
};

struct Link {
  FaultModel model;
  bool custom = false;
  uint64_t next_index = 0;
  FaultCounters counters;
};

constexpr size_t kMaxDeliveriesPerPoll = 256;

}  // namespace

struct SimNetwork::State {
  explicit State(const Clock& c) : clock(c) {}

  const Clock& clock;
  mutable std::mutex mu;
  std::map<UdpEndpoint, std::shared_ptr<Port>> ports;
  std::map<std::pair<UdpEndpoint, UdpEndpoint>, Link> links;
  FaultConfig default_faults;
  uint64_t seq = 0;
  uint64_t unroutable = 0;
  bool trace_on = false;
  std::vector<SimTraceEvent> trace;

  Link& LinkFor(const UdpEndpoint& from, const UdpEndpoint& to) {
    auto [it, inserted] = links.try_emplace({from, to});
    if (inserted) it->second.model = FaultModel(default_faults, FaultStreamId(from, to));
    return it->second;
  }
};

namespace {

class SimTransport final : public Transport {
 public:
  SimTransport(std::shared_ptr<SimNetwork::State> state, std::shared_ptr<Port> port, UdpEndpoint local,
               std::vector<IpAddress> addresses)
      : state_(std::move(state)), port_(std::move(port)), local_(local), addresses_(std::move(addresses)) {}

  ~SimTransport() override {
    std::lock_guard lock(state_->mu);
    for (const IpAddress& a : addresses_) {
      auto it = state_->ports.find(UdpEndpoint{a, local_.port});
      if (it != state_->ports.end() && it->second == port_) state_->ports.erase(it);
    }
    port_->queue.clear();
  }

  UdpEndpoint local() const override { return local_; }

  Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t src_port) const override {
    return Flow{SourceFor(src_port), dst, 0};
  }

  int Send(std::span<const OutDatagram> batch) override {
    SimNetwork::State& s = *state_;
    std::lock_guard lock(s.mu);
    const uint64_t now = s.clock.NowNs();
    for (const OutDatagram& dg : batch) {
      // From one of our addresses (a kernel refuses to send from another's: counted as unroutable here).
      const UdpEndpoint from{dg.src_addr.is_unspecified() ? local_.addr : dg.src_addr, local_.port};
      auto port_it = s.ports.find(dg.dst);
      if (port_it == s.ports.end() || std::find(addresses_.begin(), addresses_.end(), from.addr) == addresses_.end()) {
        ++s.unroutable;
        if (s.trace_on) {
          s.trace.push_back({SimTraceEvent::Kind::kUnroutable, now, from, dg.dst, 0, 0, {}, dg.payload.size(),
                             Fnv1a64(dg.payload)});
        }
        continue;
      }
      Link& link = s.LinkFor(from, dg.dst);
      const uint64_t index = link.next_index++;
      const FaultDecision d = link.model.Decide(index, dg.payload.size());
      link.counters.Count(d);
      if (s.trace_on) {
        s.trace.push_back(
            {SimTraceEvent::Kind::kSent, now, from, dg.dst, index, 0, d, dg.payload.size(), Fnv1a64(dg.payload)});
      }
      if (d.drop) continue;
      Port& port = *port_it->second;
      for (int copy = 0; copy < d.copies; ++copy) {
        Queued q{UdpEndpoint{from.addr, dg.src_port ? dg.src_port : local_.port}, dg.dst,
                 std::vector<uint8_t>(dg.payload.begin(), dg.payload.end()), index, copy};
        if (copy == 0) FlipBit(q.payload, d.corrupt_bit);
        port.queue.emplace(std::make_pair(now + d.extra_delay_ns, ++s.seq), std::move(q));
      }
      port.cv.notify_all();
    }
    return int(batch.size());
  }

  int Poll(const DatagramHandler& handler, int64_t timeout_ns) override {
    SimNetwork::State& s = *state_;
    const auto real_deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns > 0 ? timeout_ns : 0);
    std::unique_lock lock(s.mu);
    while (true) {
      const uint64_t now = s.clock.NowNs();
      std::vector<std::pair<uint64_t, Queued>> due;
      while (!port_->queue.empty() && due.size() < kMaxDeliveriesPerPoll) {
        auto it = port_->queue.begin();
        if (it->first.first > now) break;
        if (s.trace_on) {
          s.trace.push_back({SimTraceEvent::Kind::kDelivered, it->first.first, it->second.src, it->second.dst,
                             it->second.link_index, it->second.copy,
                             {}, it->second.payload.size(), Fnv1a64(it->second.payload)});
        }
        due.emplace_back(it->first.first, std::move(it->second));
        port_->queue.erase(it);
      }
      if (!due.empty()) {
        lock.unlock();  // the handler may Send on this network
        for (const auto& [time, q] : due) {
          InDatagram in;
          in.src = q.src;
          in.dst = q.dst;
          in.payload = q.payload;
          if (q.src.addr.is_v4()) in.ip_id = 0;  // DF datagrams carry ID 0 (see Flow)
          in.timestamp_ns = time;
          handler(in);
        }
        return int(due.size());
      }
      if (port_->wake) {
        port_->wake = false;
        return 0;
      }
      if (timeout_ns == 0) return 0;
      // Sleep until the next datagram is due (on the network's clock), the timeout, or a send / Wake notifies us.
      std::optional<std::chrono::nanoseconds> wait;
      if (!port_->queue.empty()) wait = std::chrono::nanoseconds(port_->queue.begin()->first.first - now);
      if (timeout_ns > 0) {
        const auto left = real_deadline - std::chrono::steady_clock::now();
        if (left <= std::chrono::nanoseconds(0)) return 0;
        if (!wait || left < *wait) wait = std::chrono::duration_cast<std::chrono::nanoseconds>(left);
      }
      if (wait) {
        port_->cv.wait_for(lock, *wait);
      } else {
        port_->cv.wait(lock);
      }
    }
  }

  void Wake() override {
    std::lock_guard lock(state_->mu);
    port_->wake = true;
    port_->cv.notify_all();
  }

 private:
  UdpEndpoint SourceFor(uint16_t src_port) const { return UdpEndpoint{local_.addr, src_port ? src_port : local_.port}; }

  std::shared_ptr<SimNetwork::State> state_;
  std::shared_ptr<Port> port_;
  const UdpEndpoint local_;
  const std::vector<IpAddress> addresses_;  // local_'s first, then those of Attach's `more`
};

}  // namespace

uint64_t Fnv1a64(std::span<const uint8_t> bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

std::string SimTraceEvent::ToString() const {
  const char* k = kind == Kind::kSent ? "sent" : kind == Kind::kUnroutable ? "unroutable" : "delivered";
  std::string s = std::to_string(time_ns) + " " + k + " " + from.ToString() + "->" + to.ToString() + " #" +
                  std::to_string(link_index) + " len=" + std::to_string(payload_len);
  if (kind == Kind::kSent) {
    s += " drop=" + std::to_string(decision.drop) + " copies=" + std::to_string(decision.copies) +
         " reorder=" + std::to_string(decision.reorder) + " bit=" + std::to_string(decision.corrupt_bit);
  } else if (kind == Kind::kDelivered) {
    s += " copy=" + std::to_string(copy);
  }
  return s;
}

SimNetwork::SimNetwork(const Clock& clock) : state_(std::make_shared<State>(clock)) {}
SimNetwork::~SimNetwork() = default;

std::unique_ptr<Transport> SimNetwork::Attach(const UdpEndpoint& local, std::span<const IpAddress> more) {
  std::lock_guard lock(state_->mu);
  std::vector<IpAddress> addresses{local.addr};
  for (const IpAddress& a : more) {
    if (std::find(addresses.begin(), addresses.end(), a) == addresses.end()) addresses.push_back(a);
  }
  auto taken = [&](uint16_t port) {
    for (const IpAddress& a : addresses) {
      if (state_->ports.count(UdpEndpoint{a, port})) return true;
    }
    return false;
  };
  UdpEndpoint ep = local;
  if (ep.port == 0) {
    for (uint32_t p = 49152; p <= 65535; ++p) {
      ep.port = uint16_t(p);
      if (!taken(ep.port)) break;
    }
  }
  if (ep.port == 0 || taken(ep.port)) return nullptr;
  auto port = std::make_shared<Port>();
  for (const IpAddress& a : addresses) state_->ports.emplace(UdpEndpoint{a, ep.port}, port);
  return std::make_unique<SimTransport>(state_, std::move(port), ep, std::move(addresses));
}

void SimNetwork::SetFaults(const UdpEndpoint& from, const UdpEndpoint& to, const FaultConfig& config) {
  std::lock_guard lock(state_->mu);
  Link& link = state_->LinkFor(from, to);
  link.model = FaultModel(config, FaultStreamId(from, to));
  link.custom = true;
}

void SimNetwork::SetDefaultFaults(const FaultConfig& config) {
  std::lock_guard lock(state_->mu);
  state_->default_faults = config;
  for (auto& [key, link] : state_->links) {
    if (!link.custom) link.model = FaultModel(config, FaultStreamId(key.first, key.second));
  }
}

std::optional<uint64_t> SimNetwork::NextDeliveryNs() const {
  std::lock_guard lock(state_->mu);
  std::optional<uint64_t> next;
  for (const auto& [ep, port] : state_->ports) {
    if (port->queue.empty()) continue;
    const uint64_t t = port->queue.begin()->first.first;
    if (!next || t < *next) next = t;
  }
  return next;
}

FaultCounters SimNetwork::counters(const UdpEndpoint& from, const UdpEndpoint& to) const {
  std::lock_guard lock(state_->mu);
  auto it = state_->links.find({from, to});
  return it == state_->links.end() ? FaultCounters{} : it->second.counters;
}

FaultCounters SimNetwork::total_counters() const {
  std::lock_guard lock(state_->mu);
  FaultCounters total;
  for (const auto& [key, link] : state_->links) total += link.counters;
  return total;
}

uint64_t SimNetwork::unroutable() const {
  std::lock_guard lock(state_->mu);
  return state_->unroutable;
}

void SimNetwork::EnableTrace(bool on) {
  std::lock_guard lock(state_->mu);
  state_->trace_on = on;
}

std::vector<SimTraceEvent> SimNetwork::trace() const {
  std::lock_guard lock(state_->mu);
  return state_->trace;
}

}  // namespace uroce::wire
