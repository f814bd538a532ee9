// Per-QP state of the Reliable Connection protocol (IBTA vol1 9.7): the requester's send queue and retransmission
// state, and the responder's expected PSN, MSN and saved READ/atomic responses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <string_view>

#include "emu/work_request.h"

namespace uroce::emu {

// 24-bit PSN arithmetic (IBTA 9.7.1: PSNs wrap modulo 2^24; "earlier" is within half the space).
inline uint32_t PsnAdd(uint32_t psn, int64_t n) { return static_cast<uint32_t>(psn + n) & 0xffffff; }
// Signed distance a - b in the 24-bit PSN space.
inline int32_t PsnDiff(uint32_t a, uint32_t b) { return static_cast<int32_t>((a - b) << 8) >> 8; }

// Where a send WQE of an RC QP is between post and completion. It completes (CQE, leaves the queue) when it is
// kDone and every WQE before it has completed: RC completes in order (IBTA 9.7.5.1.2).
enum class WqeState : uint8_t {
  kPosted,    // queued; no PSN range yet (the requester has not reached it, or a window or fence holds it)
  kInFlight,  // has a PSN range and its first packet left: waits for its ACK, READ responses or atomic ACK
  kDone,      // acknowledged, answered in full, executed locally (bind, local invalidate) or failed
};
constexpr std::string_view ToString(WqeState state) {
  switch (state) {
    case WqeState::kPosted: return "posted";
    case WqeState::kInFlight: return "in-flight";
    case WqeState::kDone: return "done";
  }
  return "?";
}

// A send WQE of an RC QP from post to completion.
struct SendWqe {
  SendWr wr;
  WqeState state = WqeState::kPosted;
  uint32_t first_psn = 0;
  uint32_t npsn = 0;         // PSNs it occupies: packets, or for a READ the response packets
  uint64_t length = 0;       // message bytes
  uint32_t read_next = 0;    // READ: index of the next response packet expected
  uint32_t rerequested_from = ~0u;  // READ: where the latest request after a lost response started (one per gap)
  WcStatus status = WcStatus::kSuccess;
  bool started() const { return state != WqeState::kPosted; }
  bool in_flight() const { return state == WqeState::kInFlight; }
  bool done() const { return state == WqeState::kDone; }
  SendOpcodeInfo::Kind kind() const { return FindSendOpcode(wr.opcode)->kind; }  // posted: a known opcode
  bool is_read() const { return kind() == SendOpcodeInfo::Kind::kRead; }
  bool is_atomic() const { return kind() == SendOpcodeInfo::Kind::kAtomic; }
  bool is_local() const { return kind() == SendOpcodeInfo::Kind::kLocal; }
  uint32_t last_psn() const { return (first_psn + npsn - 1) & 0xffffff; }
};

// Packets a message of `length` bytes takes at path MTU `mtu` (a message of 0 bytes is one packet).
inline uint32_t PacketsFor(uint64_t length, uint32_t mtu) {
  return length == 0 ? 1 : static_cast<uint32_t>((length + mtu - 1) / mtu);
}

// A READ is requested in segments of at most this many response packets, the next one once the previous has
// arrived, so what one READ has in flight towards the requester is bounded like the window of a WRITE. On the wire a
// segment is a READ request for part of the message, as a retried READ is (IBTA 9.7.4.1.4).
inline constexpr uint32_t kReadSegmentPackets = 64;
// One past the last response packet of the READ segment that holds response packet `k`.
inline uint32_t ReadSegmentEnd(const SendWqe& w, uint32_t k) {
  return std::min(w.npsn, (k / kReadSegmentPackets + 1) * kReadSegmentPackets);
}

// The RC requester's state (rc_requester.h works on it; the completer moves it as responses arrive).
struct RcRequesterState {
  std::deque<SendWqe> sq;  // posted and not yet completed, in order
  // Transmission cursor: the WQE (index into sq) and packet within it to send next. Go-back-N resets it.
  size_t cursor_wqe = 0;
  uint32_t cursor_pkt = 0;
  // Every PSN before this one is acknowledged (a coalesced ACK may cover part of a long message). Bounds the window
  // and is where go-back-N restarts.
  uint32_t acked_psn_next = 0;
  // One past the highest PSN sent (for a READ, the highest response PSN asked for): what lies between acked_psn_next
  // and it is in flight, and charged to the path's shared window (`charged` packets now).
  uint32_t sent_psn_next = 0;
  int64_t charged = 0;
  bool waiting_for_path = false;  // queued on the path's waiting list
  // New packets sent since the last that asked for an ACK (AckReq; a READ request or atomic asks for its answer).
  uint32_t packets_since_ack_req = 0;
  // Whether the newest packet sent asked for an ACK. A requester stops for the path's window only then: otherwise
  // nothing would acknowledge what it has in flight, and, with the window full of its own packets, nothing would
  // wake it before the local ACK timeout. It predicts the stop and sets AckReq on the packet before, but another
  // QP's thread may fill the window in between.
  bool tail_asks_ack() const { return packets_since_ack_req == 0; }
  uint64_t retransmit_deadline_ns = 0;  // local ACK timeout (0: not armed)
  uint64_t rnr_deadline_ns = 0;         // waiting out an RNR NAK (0: not waiting)
  bool timer_listed = false;            // in DeviceCore::timed_qps
  // Early retransmission (DeviceConfig::early_retransmit): while the retransmit timer runs, the time of the next
  // go-back-N that spends no retry (0: none), and the wait before it, doubled after each.
  uint64_t probe_deadline_ns = 0;
  uint64_t probe_wait_ns = 0;
  uint64_t path_delivered_seen = 0;  // the path's delivered count when the probe was armed or last looked at
  bool implied_nak_resent = false;   // an atomic was sent again for an implied NAK; no more until progress
  uint32_t tail_probes = 0;          // tail probes sent since the timer last started (RcRequester::kTailProbes)
  uint32_t path_silent_looks = 0;    // probes in a row that found nothing delivered on the path since the last
  // Round-trip time: one packet at a time is timed from its first sending to the ACK that covers it (never a packet
  // sent again: Karn's rule); the samples go to the path's estimate (PathWindow::OnRoundTrip).
  uint64_t rtt_sent_ns = 0;  // when the timed packet left (0: none timed)
  uint32_t rtt_psn = 0;
  uint64_t rtt_seq = 0;  // the timed packet's number in path order (PathWindow::NoteSent)
  uint64_t newest_sent_seq = 0;  // the path-order number of the newest packet sent, new or again
  int retries_left = 0;
  int rnr_retries_left = 0;
  bool drained_event_pending = false;   // SQD entered with en_sqd_async_notify
};

// A READ or atomic the responder executed, kept to answer a duplicate request again without executing it twice
// (IBTA 9.7.5.1.6 / 9.7.5.2.3 and C9-??: duplicate atomics return the saved result).
struct ResponderResource {
  bool atomic = false;
  uint32_t psn = 0;
  uint32_t npsn = 1;
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
  uint64_t original = 0;  // atomic: the value before the operation
  uint32_t msn = 0;
};

// The RC responder's state (rc_responder.h).
struct RcResponderState {
  uint32_t msn = 0;
  bool nak_outstanding = false;  // a PSN sequence error NAK was sent for the current expected PSN
  bool comm_established = false;
  std::deque<ResponderResource> resources;  // most recent last
  // An ACK held back (AckTiming::kHeld): the newest PSN it acknowledges, the MSN then, and when it must
  // leave at the latest. Any later ACK or NAK of this responder covers it (IBTA 9.7.5.1.2: an ACK acknowledges
  // every earlier PSN; a NAK every PSN before its own).
  bool ack_held = false;
  uint32_t held_psn = 0, held_msn = 0;
  uint64_t held_due_ns = 0;
};

}  // namespace uroce::emu
