// PollPattern: from the timeline of an application's CQ polls, whether a thread that found a CQ empty should take
// the receive side over from the progress thread (verbs_api/engine.h, docs/ARCHITECTURE.md "Progress: who
// receives"). Lock-free; any number of application threads may report into one PollPattern.
//
// A thread engages when it has polled empty CQs without a gap above kStreakGapNs for kEngageNs (a program that polls
// once and then sleeps never does; on an emulated machine, one that held the receive side keeps its streak through
// one such gap every kForgiveGapEveryNs, a preemption), and when it comes back to poll soon after a completion: its
// think time, from a poll that returned completions to the next empty poll, averaged, is under kThinkNs. A program
// that polls a CQ and then waits elsewhere (spinning on memory for an RDMA WRITE that would arrive after its
// completion) must not engage: nobody would receive for it until the lease ended. ib_write_lat polls its send CQ and
// then spins on memory, but the peer's WRITE arrives before the ACK that completes its own (held ACKs,
// emu::Device::AckTiming::kHeld), so its think times stay short.
//
// The think time leaves out the time spent inside data-path verbs (OnTimeInside). Think times are sampled only while
// the application holds the receive side. Measured while the progress thread receives they mean nothing: its
// wake-ups inflate them for a ping-pong (ib_send_lat stayed disengaged, 40 us per half round trip instead of 6), and
// for one that waits on memory they shrink, since one wake-up delivers the ACK and the peer's WRITE together. A
// disengaged process is offered the receive side again every kProbeEveryNs, starting just under
// kThinkNs, so that one long think ends the offer. Each sample is clipped at kThinkClipNs: one preemption (2 cores,
// four busy threads) is a think time of a whole time slice, and must not end a ping-pong's engagement (it takes five
// in a row from a think time of ~1 us; from the start, six long thinks disengage).
#pragma once

#include <atomic>
#include <cstdint>

namespace uroce::verbs {

class PollPattern {
 public:
  static constexpr uint64_t kEngageNs = 20'000;
  static constexpr uint64_t kStreakGapNs = 50'000;
  static constexpr uint64_t kThinkNs = 6'000;
  static constexpr uint64_t kThinkClipNs = 2 * kThinkNs;
  static constexpr uint64_t kProbeEveryNs = 100'000'000;
  // A thread holding the receive side keeps it through one gap above kStreakGapNs (a preemption) in this long: on
  // an emulated machine only (time scale kEmulatedScale or more), where a handover costs milliseconds. Natively it
  // saved handovers that cost microseconds, and with it libfabric's fi_pingpong -e rdm server crashed in its
  // teardown (SIGSEGV inside libfabric, after its last message) in 3 of 125 runs, against 0 of 130 without.
  static constexpr uint64_t kForgiveGapEveryNs = 8 * kStreakGapNs;
  static constexpr double kEmulatedScale = 5;

  // The thresholds above (but kProbeEveryNs) are for an ordinary machine; on one that runs `scale` times slower
  // (verbs_api/time_scale.h) they are that many times longer. Call before the first report.
  void SetTimeScale(double scale) {
    engage_ns_ = uint64_t(double(kEngageNs) * scale);
    streak_gap_ns_ = uint64_t(double(kStreakGapNs) * scale);
    think_limit_ns_ = uint64_t(double(kThinkNs) * scale);
    think_clip_ns_ = 2 * think_limit_ns_;
    forgive_gaps_ = scale >= kEmulatedScale;
    forgive_every_ns_ = uint64_t(double(kForgiveGapEveryNs) * scale);
  }

  // A poll returned completions at `now_ns`: the start of a think time.
  void OnCompletion(uint64_t now_ns) {
    inside_ns_.store(0, std::memory_order_relaxed);
    last_completion_ns_.store(now_ns, std::memory_order_relaxed);
  }
  // The application spent `ns` inside a data-path verb (ibv_post_send, ibv_post_recv, ...): not think time, since
  // the library does that work whoever receives. Without this, ib_write_bw's think time (reposting after each
  // completion) sat right at kThinkNs. Nor does it break a streak of empty polls: ib_write_bw's posts of 64 KiB
  // messages (16 packets sent from the posting thread) took longer than kStreakGapNs, and it never engaged.
  void OnTimeInside(uint64_t ns) {
    inside_ns_.fetch_add(ns, std::memory_order_relaxed);
    inside_since_poll_ns_.fetch_add(ns, std::memory_order_relaxed);
  }
  // A poll found the CQ empty at `now_ns`. Returns true when the polling thread should hold the receive side.
  bool OnEmptyPoll(uint64_t now_ns);
  // After an empty poll that OnEmptyPoll engaged: whether the thread then held the receive side (false while the
  // progress thread is still handing it over, or another application thread has it). Think times are sampled only
  // after polls that held it, as the class comment says: the polls of a handover share the CPU with the progress
  // thread that is stepping aside, and their long think times could disengage a process that had just engaged.
  void OnReceiveSide(bool held) { held_.store(held, std::memory_order_relaxed); }
  // The application arms a CQ to sleep on its channel (ibv_req_notify_cq): the streak of empty polls ends.
  void OnSleep(uint64_t now_ns) { streak_start_ns_.store(now_ns, std::memory_order_relaxed); }
  // When a poll last found a CQ empty (0: never): an application thread is spinning on CQs.
  uint64_t last_empty_poll_ns() const { return last_empty_poll_ns_.load(std::memory_order_relaxed); }
  // The averaged think time (printed with the counters).
  uint64_t think_ns() const { return think_ns_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> last_empty_poll_ns_{0};
  std::atomic<uint64_t> streak_start_ns_{0};
  std::atomic<uint64_t> last_completion_ns_{0};
  std::atomic<uint64_t> inside_ns_{0};  // time inside data-path verbs since the last completion
  std::atomic<uint64_t> inside_since_poll_ns_{0};  // ... and since the last empty poll
  std::atomic<uint64_t> think_ns_{0};  // moving average of clipped samples taken while engaged
  std::atomic<bool> engaged_{false};   // the last verdict of OnEmptyPoll
  std::atomic<bool> held_{false};      // the last engaged poll held the receive side (OnReceiveSide)
  std::atomic<uint64_t> last_probe_ns_{0};
  std::atomic<uint64_t> last_forgiven_ns_{0};  // the last gap a holding thread kept its engagement through
  bool forgive_gaps_ = false;
  uint64_t forgive_every_ns_ = kForgiveGapEveryNs;
  uint64_t engage_ns_ = kEngageNs, streak_gap_ns_ = kStreakGapNs, think_limit_ns_ = kThinkNs,
           think_clip_ns_ = kThinkClipNs;
};

}  // namespace uroce::verbs
