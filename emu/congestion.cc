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
