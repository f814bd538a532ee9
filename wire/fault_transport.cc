#include "wire/fault_transport.h"

#include <chrono>

namespace uroce::wire {

FaultInjectingTransport::FaultInjectingTransport(std::unique_ptr<Transport> inner, const Clock& clock,
                                                 const FaultConfig& send_faults, const FaultConfig& receive_faults,
                                                 uint64_t stream_id)
    : inner_(std::move(inner)),
      clock_(clock),
      send_model_(send_faults, stream_id),
      receive_model_(receive_faults, stream_id + 1) {}

FaultInjectingTransport::~FaultInjectingTransport() = default;

void FaultInjectingTransport::ReleaseDueSendsLocked(uint64_t now) {
  if (held_sends_.empty() || held_sends_.begin()->first.first > now) return;
  std::vector<OutDatagram> out;
  for (auto it = held_sends_.begin(); it != held_sends_.end() && it->first.first <= now; ++it) {
    out.push_back(
        OutDatagram{it->second.dst, it->second.src_port, it->second.payload, it->second.has_icrc, it->second.altered,
                    it->second.src_addr});
  }
  const int sent = inner_->Send(out);
  // What the inner transport did not take stays held and is retried on the next call.
  for (int i = 0; i < sent; ++i) held_sends_.erase(held_sends_.begin());
}

int FaultInjectingTransport::Send(std::span<const OutDatagram> batch) {
  std::lock_guard lock(send_mu_);
  const uint64_t now = clock_.NowNs();
  ReleaseDueSendsLocked(now);

  struct Pending {
    size_t owner;  // index into batch
    uint64_t delay_ns;
    OutDatagram dg;
  };
  std::vector<FaultDecision> decisions(batch.size());
  std::vector<std::vector<uint8_t>> corrupted;  // owns flipped copies until inner Send returns
  corrupted.reserve(batch.size());
  std::vector<Pending> immediate, delayed;
  for (size_t i = 0; i < batch.size(); ++i) {
    const FaultDecision d = send_model_.Decide(send_index_ + i, batch[i].payload.size());
    decisions[i] = d;
    if (d.drop) continue;
    for (int copy = 0; copy < d.copies; ++copy) {
      OutDatagram dg = batch[i];
      if (copy == 0 && d.corrupt_bit >= 0) {
        corrupted.emplace_back(dg.payload.begin(), dg.payload.end());
        FlipBit(corrupted.back(), d.corrupt_bit);
        dg.payload = corrupted.back();
        dg.altered = true;
      }
      (d.extra_delay_ns > 0 ? delayed : immediate).push_back(Pending{i, d.extra_delay_ns, dg});
    }
  }

  size_t accepted = batch.size();
  if (!immediate.empty()) {
    std::vector<OutDatagram> out;
    out.reserve(immediate.size());
    for (const Pending& p : immediate) out.push_back(p.dg);
    const int r = inner_->Send(out);
    if (r < 0) {
      accepted = immediate[0].owner;  // the dropped / held-only datagrams before the first failure
      if (accepted == 0) return r;
    } else if (size_t(r) < out.size()) {
      const size_t k = size_t(r);
      // A duplicate whose first copy went out counts as sent; its second copy is lost, as a network may.
      accepted = (k > 0 && immediate[k - 1].owner == immediate[k].owner) ? immediate[k].owner + 1 : immediate[k].owner;
    }
  }
  for (const Pending& p : delayed) {
    if (p.owner >= accepted) break;
    held_sends_.emplace(std::make_pair(now + p.delay_ns, send_seq_++),
                        HeldSend{p.dg.dst, p.dg.src_port, std::vector<uint8_t>(p.dg.payload.begin(), p.dg.payload.end()),
                                 p.dg.has_icrc, p.dg.altered, p.dg.src_addr});
  }
  for (size_t i = 0; i < accepted; ++i) send_counters_.Count(decisions[i]);
  send_index_ += accepted;
  return int(accepted);
}

int FaultInjectingTransport::DeliverDueReceives(const DatagramHandler& handler) {
  std::vector<std::pair<uint64_t, HeldReceive>> due;
  {
    std::lock_guard lock(receive_mu_);
    const uint64_t now = clock_.NowNs();
    while (!held_receives_.empty() && held_receives_.begin()->first.first <= now) {
      auto it = held_receives_.begin();
      due.emplace_back(it->first.first, std::move(it->second));
      held_receives_.erase(it);
    }
  }
  for (const auto& [time, h] : due) {
    InDatagram in;
    in.src = h.src;
    in.dst = h.dst;
    in.ip_id = h.ip_id;
    in.payload = h.payload;
    in.icrc_vouched = h.icrc_vouched;
    in.timestamp_ns = time;
    handler(in);
  }
  return int(due.size());
}

std::optional<uint64_t> FaultInjectingTransport::NextReleaseNs() const {
  std::optional<uint64_t> next;
  {
    std::lock_guard lock(send_mu_);
    if (!held_sends_.empty()) next = held_sends_.begin()->first.first;
  }
  std::lock_guard lock(receive_mu_);
  if (!held_receives_.empty()) {
    const uint64_t t = held_receives_.begin()->first.first;
    if (!next || t < *next) next = t;
  }
  return next;
}

int FaultInjectingTransport::Poll(const DatagramHandler& handler, int64_t timeout_ns) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns > 0 ? timeout_ns : 0);
  const bool receive_faults = receive_model_.config().any();
  while (true) {
    {
      std::lock_guard lock(send_mu_);
      ReleaseDueSendsLocked(clock_.NowNs());
    }
    int delivered = DeliverDueReceives(handler);
    if (delivered > 0) return delivered;

    // Wait on the inner transport no longer than until the next held datagram is due.
    int64_t wait_ns = timeout_ns;
    if (timeout_ns > 0) {
      wait_ns = std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         deadline - std::chrono::steady_clock::now()).count());
    }
    if (auto next = NextReleaseNs()) {
      const uint64_t now = clock_.NowNs();
      const int64_t until = *next > now ? int64_t(std::min<uint64_t>(*next - now, INT64_MAX)) : 0;
      if (wait_ns < 0 || until < wait_ns) wait_ns = until;
    }

    int r;
    if (!receive_faults) {
      r = inner_->Poll(handler, wait_ns);
    } else {
      delivered = 0;
      r = inner_->Poll(
          [&](const InDatagram& in) {
            FaultDecision d;
            {
              std::lock_guard lock(receive_mu_);
              d = receive_model_.Decide(receive_index_++, in.payload.size());
              receive_counters_.Count(d);
              if (d.drop) return;
              if (d.extra_delay_ns > 0) {
                const uint64_t release = clock_.NowNs() + d.extra_delay_ns;
                for (int copy = 0; copy < d.copies; ++copy) {
                  HeldReceive h{in.src, in.dst, in.ip_id, std::vector<uint8_t>(in.payload.begin(), in.payload.end()),
                                in.icrc_vouched && !(copy == 0 && d.corrupt_bit >= 0)};
                  if (copy == 0) FlipBit(h.payload, d.corrupt_bit);
                  held_receives_.emplace(std::make_pair(release, receive_seq_++), std::move(h));
                }
                return;
              }
            }
            for (int copy = 0; copy < d.copies; ++copy) {
              if (copy == 0 && d.corrupt_bit >= 0) {
                std::vector<uint8_t> flipped(in.payload.begin(), in.payload.end());
                FlipBit(flipped, d.corrupt_bit);
                InDatagram c = in;
                c.payload = flipped;
                c.icrc_vouched = false;
                handler(c);
              } else {
                handler(in);
              }
              ++delivered;
            }
          },
          wait_ns);
      if (r >= 0) r = delivered;
    }
    if (r != 0) return r;
    if (woken_.exchange(false)) return 0;
    if (timeout_ns == 0) return DeliverDueReceives(handler);
    if (timeout_ns > 0 && std::chrono::steady_clock::now() >= deadline) {
      std::lock_guard lock(send_mu_);
      ReleaseDueSendsLocked(clock_.NowNs());
      return 0;
    }
  }
}

void FaultInjectingTransport::Wake() {
  woken_.store(true);
  inner_->Wake();
}

FaultCounters FaultInjectingTransport::send_counters() const {
  std::lock_guard lock(send_mu_);
  return send_counters_;
}

FaultCounters FaultInjectingTransport::receive_counters() const {
  std::lock_guard lock(receive_mu_);
  return receive_counters_;
}

size_t FaultInjectingTransport::held_sends() const {
  std::lock_guard lock(send_mu_);
  return held_sends_.size();
}

size_t FaultInjectingTransport::held_receives() const {
  std::lock_guard lock(receive_mu_);
  return held_receives_.size();
}

}  // namespace uroce::wire
