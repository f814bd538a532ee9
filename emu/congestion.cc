#include "emu/congestion.h"

#include <algorithm>

namespace uroce::emu {

void PathWindow::Charge(int64_t delta) { in_flight_ = std::max<int64_t>(0, in_flight_ + delta); }

void PathWindow::OnDelivered(uint32_t n) {
  delivered_ += n;
  if (window_ < threshold_) {
    window_ = std::min(threshold_, window_ + n);  // slow start: one more packet per packet delivered
  } else {
    window_ += double(n) / window_;  // congestion avoidance: one more packet per window delivered
  }
  window_ = std::min(window_, kMax);
}

void PathWindow::OnCongestion() {
  if (decreases_ > 0 && delivered_ < recovery_until_) return;  // the same loss episode
  window_ = std::max(kMin, window_ / 2);
  threshold_ = window_;
  recovery_until_ = delivered_ + uint64_t(in_flight_);
  ++decreases_;
}

void PathWindow::OnUnreliableCnp(uint64_t now_ns) {
  if (unreliable_rate_ != 0 && now_ns - unreliable_last_cnp_ns_ < kUnreliableCnpIntervalNs) return;
  unreliable_rate_ = unreliable_rate_ == 0 ? kUnreliableInitialRate : std::max(kUnreliableMinRate, unreliable_rate_ / 2);
  unreliable_last_cnp_ns_ = now_ns;
}

uint64_t PathWindow::UnreliableSendAt(uint64_t now_ns) {
  if (unreliable_rate_ == 0) return 0;
  // Recovery: 1.5 times faster for each quiet kUnreliableRecoveryNs since the last CNP (or the last step up).
  while (unreliable_rate_ != 0 && now_ns - unreliable_last_cnp_ns_ >= kUnreliableRecoveryNs) {
    unreliable_last_cnp_ns_ += kUnreliableRecoveryNs;
    unreliable_rate_ *= 1.5;
    if (unreliable_rate_ > kUnreliableMaxRate) unreliable_rate_ = 0;
  }
  return unreliable_rate_ == 0 ? 0 : unreliable_next_send_ns_;
}

void PathWindow::ChargeUnreliable(uint64_t bytes, uint64_t now_ns) {
  if (unreliable_rate_ == 0) return;
  unreliable_next_send_ns_ = std::max(unreliable_next_send_ns_, now_ns) + uint64_t(double(bytes) / unreliable_rate_);
}

void PathWindow::OnRoundTrip(uint64_t sample_ns) {
  if (srtt_ns_ == 0) {
    srtt_ns_ = sample_ns;
    rttvar_ns_ = sample_ns / 2;
    return;
  }
  const uint64_t deviation = srtt_ns_ > sample_ns ? srtt_ns_ - sample_ns : sample_ns - srtt_ns_;
  rttvar_ns_ = rttvar_ns_ - rttvar_ns_ / 4 + deviation / 4;
  srtt_ns_ = srtt_ns_ - srtt_ns_ / 8 + sample_ns / 8;
}

std::string_view ToString(PathWindow::Phase phase) {
  switch (phase) {
    case PathWindow::Phase::kSlowStart: return "slow-start";
    case PathWindow::Phase::kCongestionAvoidance: return "congestion-avoidance";
  }
  return "unknown";
}

}  // namespace uroce::emu
