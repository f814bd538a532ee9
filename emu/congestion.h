// Congestion control for everything a device sends towards one peer address (RoCEv2 leaves the algorithm to the
// implementation; DCQCN reacts to CNPs by cutting the rate). All RC/XRC requesters of a device that talk to one peer
// share a window of packets in flight -- sent, and neither acknowledged nor answered -- that grows while packets are
// delivered and is cut when the path shows congestion: a lost packet (sequence NAK, a gap in READ responses), a
// local ACK timeout, or a CNP from the peer. On a loopback path the peer's socket receive buffer is the bottleneck:
// without a shared window, N QPs each filling their own 512-packet window overrun it and go-back-N turns the loss
// into a retransmission storm.
//
// The path also keeps the round-trip time its requesters measure (early retransmission waits a few of them).
//
// Pure arithmetic, no clock and no locks: the Device calls it under its lock.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <string_view>

namespace uroce::emu {

class PathWindow {
 public:
  // Packets. The initial window is what a default 212992-byte socket buffer holds of 4 KiB datagrams with room to
  // spare; the maximum keeps one path under 2 MiB at the 4 KiB MTU, well within the 8 MiB socket buffers uroce asks for.
  static constexpr double kInitial = 32;
  static constexpr double kMin = 8;
  static constexpr double kMax = 512;
  static constexpr double kWakeBurst = 16;  // a 64 KiB message at the 4 KiB MTU

  enum class Phase : uint8_t { kSlowStart, kCongestionAvoidance };

  // Whether a requester may put one more new packet in flight.
  bool MaySend() const { return in_flight_ < window_; }
  // Whether the requesters waiting for the window may be woken: when there is room for a burst (kWakeBurst packets,
  // at most a quarter of the window) or nothing is in flight -- not for every packet or two an ACK frees, which
  // would release runs of that size in turn (the send-side silly window syndrome, RFC 1122 4.2.3.4). The ACKs of
  // what is in flight bring the rest. Seen on ib_write_bw 64 KiB: in some runs sender and receiver settled into ~5
  // packets per UDP_SEGMENT send and an ACK per ~6 packets, instead of 8 and 16, at half the rate.
  bool MayWake() const { return in_flight_ == 0 || window_ - double(in_flight_) >= std::min(kWakeBurst, window_ / 4); }
  // A requester's packets in flight changed by `delta` (new packets sent: > 0; acknowledged, answered or abandoned:
  // < 0).
  void Charge(int64_t delta);
  // `n` packets were delivered (acknowledged or answered): the window grows, by n in slow start, by n / window after.
  void OnDelivered(uint32_t n);
  // A loss (sequence NAK, READ response gap, local ACK timeout) or a CNP: the window halves, once per window of
  // deliveries (the rest of one loss episode is not a new signal), and growth continues additively. A timeout does
  // not restart from the minimum as TCP's would: on the lossy links uroce emulates most timeouts follow a lost tail
  // packet, not a collapsed path, and a window of a few packets turns every later loss into another timeout.
  void OnCongestion();

  // A round-trip time measured by one of the path's requesters (a packet's first sending to the ACK that covers it).
  // All requesters towards the peer share the path's queue -- with many QPs one QP's packets wait behind the others'
  // window -- so they share one estimate, smoothed as RFC 6298 does: srtt += (sample - srtt) / 8, rttvar +=
  // (|srtt - sample| - rttvar) / 4, the first sample giving srtt and half of it as rttvar.
  void OnRoundTrip(uint64_t sample_ns);
  uint64_t srtt_ns() const { return srtt_ns_; }      // 0: no sample yet
  uint64_t rttvar_ns() const { return rttvar_ns_; }

  // Path order, for loss detection across QPs (RACK, RFC 8985, with the order in which packets left for the time
  // they left): every packet a requester sends towards the peer, new or again, takes the next number, and a
  // requester reports the number of each timed packet once an ACK covers it. A device's packets to one peer leave
  // through one socket in that order, and a peer takes them in it; so once a packet numbered after all of a QP's
  // has been acknowledged, that QP's are lost or answered, not still on their way.
  uint64_t NoteSent() { return ++sent_seq_; }
  uint64_t delivered() const { return delivered_; }  // packets delivered so far (OnDelivered)
  void OnDeliveredSent(uint64_t seq) { delivered_seq_ = std::max(delivered_seq_, seq); }
  bool DeliveredSentAfter(uint64_t seq) const { return delivered_seq_ > seq; }

  double window() const { return window_; }
  int64_t in_flight() const { return in_flight_; }
  Phase phase() const { return window_ < threshold_ ? Phase::kSlowStart : Phase::kCongestionAvoidance; }
  uint64_t decreases() const { return decreases_; }

  // Unreliable (UC, UD) sending towards the peer, paced once the peer's CNPs asked for it (DCQCN's reaction point, in
  // its simplest form): unlimited until a first CNP, then kUnreliableInitialRate bytes/ns, halved by each later CNP
  // (at most one per kUnreliableCnpIntervalNs, never below kUnreliableMinRate), and 1.5 times faster for each
  // kUnreliableRecoveryNs without one, unlimited again above kUnreliableMaxRate. A sender paced this way stays
  // below what a receiver takes on average, so the receiver's queue absorbs the time it is not running (a time
  // slice on a busy host) instead of overflowing, which UC and UD cannot repair.
  static constexpr double kUnreliableInitialRate = 1.0;  // bytes per ns: ~1 GB/s
  static constexpr double kUnreliableMinRate = 0.02;
  static constexpr double kUnreliableMaxRate = 8.0;
  static constexpr uint64_t kUnreliableCnpIntervalNs = 50'000;
  static constexpr uint64_t kUnreliableRecoveryNs = 2'000'000;
  // A CNP for one of this device's UC/UD QPs arrived from the peer at `now_ns`.
  void OnUnreliableCnp(uint64_t now_ns);
  // When the next unreliable message may leave (<= now_ns: at once).
  uint64_t UnreliableSendAt(uint64_t now_ns);
  // An unreliable message of `bytes` left at `now_ns`.
  void ChargeUnreliable(uint64_t bytes, uint64_t now_ns);
  double unreliable_rate() const { return unreliable_rate_; }  // bytes per ns; 0: unlimited
  // When this device last sent the peer a CNP (DeviceCore::kCnpIntervalNs).
  uint64_t last_cnp_sent_ns = 0;

  // QPNs of requesters that stopped because the window was full, woken in order as it opens (each at most once).
  std::deque<uint32_t>& waiting() { return waiting_; }
  const std::deque<uint32_t>& waiting() const { return waiting_; }

 private:
  double window_ = kInitial;
  double threshold_ = kMax;
  int64_t in_flight_ = 0;
  uint64_t delivered_ = 0;
  uint64_t recovery_until_ = 0;  // deliveries before a new congestion signal counts again
  uint64_t decreases_ = 0;
  uint64_t srtt_ns_ = 0;
  uint64_t rttvar_ns_ = 0;
  uint64_t sent_seq_ = 0;       // the number the newest packet sent took (NoteSent)
  uint64_t delivered_seq_ = 0;  // the highest number of a packet known acknowledged
  std::deque<uint32_t> waiting_;
  double unreliable_rate_ = 0;           // bytes per ns; 0: unlimited
  uint64_t unreliable_next_send_ns_ = 0;
  uint64_t unreliable_last_cnp_ns_ = 0;  // also where recovery counts from
};

std::string_view ToString(PathWindow::Phase phase);

}  // namespace uroce::emu
