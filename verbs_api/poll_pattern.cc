#include "verbs_api/poll_pattern.h"

#include <algorithm>

namespace uroce::verbs {

bool PollPattern::OnEmptyPoll(uint64_t now) {
  const uint64_t last = last_empty_poll_ns_.exchange(now, std::memory_order_relaxed);
  const uint64_t inside = inside_since_poll_ns_.exchange(0, std::memory_order_relaxed);
  if (now - last - std::min(now - last, inside) > streak_gap_ns_) {
    // A gap in the polls of a thread that held the receive side is, once in a while, a preemption (another thread's
    // time slice; in a VM, the host taking the vCPU), not a program that polls rarely: it keeps its engagement. In a
    // TCG guest each such gap had cost ~kEngageNs more of the progress thread receiving and two handovers, each a
    // thread woken on 2 busy vCPUs: milliseconds of ib_send_lat's tail.
    const bool forgive = forgive_gaps_ && engaged_.load(std::memory_order_relaxed) &&
                         held_.load(std::memory_order_relaxed) &&
                         now - last_forgiven_ns_.load(std::memory_order_relaxed) > forgive_every_ns_;
    if (forgive) {
      last_forgiven_ns_.store(now, std::memory_order_relaxed);
    } else {
      streak_start_ns_.store(now, std::memory_order_relaxed);
    }
  }
  const uint64_t completed = last_completion_ns_.load(std::memory_order_relaxed);
  uint64_t think = think_ns_.load(std::memory_order_relaxed);
  // The first empty poll since a completion, which came while this process received for itself.
  if (completed > last && completed <= now && engaged_.load(std::memory_order_relaxed) &&
      held_.load(std::memory_order_relaxed)) {
    const uint64_t before = think;
    const uint64_t outside = now - completed - std::min(now - completed, inside_ns_.load(std::memory_order_relaxed));
    think = (think * 7 + std::min(outside, think_clip_ns_)) / 8;
    think_ns_.store(think, std::memory_order_relaxed);
    // Disengaged now: the next offer comes kProbeEveryNs from here.
    if (before < think_limit_ns_ && think >= think_limit_ns_) last_probe_ns_.store(now, std::memory_order_relaxed);
  }
  if (think >= think_limit_ns_ && now - last_probe_ns_.load(std::memory_order_relaxed) > kProbeEveryNs) {
    last_probe_ns_.store(now, std::memory_order_relaxed);
    think_ns_.store(think = think_limit_ns_ - 1, std::memory_order_relaxed);
  }
  const bool engage = now - streak_start_ns_.load(std::memory_order_relaxed) >= engage_ns_ && think < think_limit_ns_;
  engaged_.store(engage, std::memory_order_relaxed);
  if (!engage) held_.store(false, std::memory_order_relaxed);
  return engage;
}

}  // namespace uroce::verbs
