// The RC requester (rc_requester.h): send WQEs -> packets within the QP's window and the path's, go-back-N on a
// timeout, a sequence NAK or after an RNR NAK's delay, and in-order completion.
#include "emu/rc_requester.h"

#include <algorithm>
#include <string>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "emu/device_core.h"
#include "emu/out_batch.h"
#include "emu/queue_pair.h"
#include "wire/frame.h"
#include "wire/headers.h"
#include "wire/opcode.h"
#include "wire/direct_access.h"
#include "wire/scratch_list.h"

namespace uroce::emu {
namespace {

// Packets in flight per QP beyond the oldest unacknowledged PSN. Bounds what one QP pushes into the peer's socket
// buffer; IBTA leaves the window to the implementation (the PSN space allows 2^23).
constexpr int32_t kWindowPackets = 512;
// AckReq (IBTA 9.7.4.1.2: the requester decides which packets ask for an ACK) on at least every 64th new packet, on
// the last packet of a message the requester does not follow with another at once, and wherever it stops.
constexpr uint32_t kAckReqEvery = 64;
// The local ACK timeout: 4.096 us x 2^timeout (IBTA 9.7.6.1.3; 0 means none).
uint64_t AckTimeoutNs(uint8_t timeout) { return timeout == 0 ? 0 : uint64_t{4096} << timeout; }

}  // namespace

void RcRequester::Charge() {
  if (qp_.type() != QpType::kRc && qp_.type() != QpType::kXrcSend) return;
  MutexLock lock(core_.paths_mu());
  ChargeLocked(core_.PathOfLocked(qp_));
}

void RcRequester::ChargeLocked(PathWindow& path) {
  RcRequesterState& r = state_;
  const QpState s = qp_.state();
  const int64_t now =
      s == QpState::kRts || s == QpState::kSqd ? std::max(0, PsnDiff(r.sent_psn_next, r.acked_psn_next)) : 0;
  if (now == r.charged) return;
  path.Charge(now - r.charged);
  // Room freed outside the completer (an error, a reset, a destroyed QP): have the timer pass wake the waiters.
  if (now < r.charged && !path.waiting().empty()) core_.WakeForTimer(core_.Now());
  r.charged = now;
}

bool RcRequester::TakeWaitingForPath() {
  if (!state_.waiting_for_path) return false;
  state_.waiting_for_path = false;
  return true;
}

int RcRequester::Post(SendWr& wr, OutBatch& out) {
  const SendOpcodeInfo* info = FindSendOpcode(wr.opcode);
  if (!ValidOn(info, qp_.init().type)) return EINVAL;
  // A READ or atomic has nothing to send inline: its data comes back.
  if ((wr.flags & send_flags::kInline) && info->carries_data && !info->allows_inline) return EINVAL;
  // IBTA 9.4.5: atomics are 8 bytes on an 8-byte aligned address; the local buffer receives the original value.
  if (info->kind == SendOpcodeInfo::Kind::kAtomic && (wr.TotalLength() != 8 || (wr.remote_addr & 7))) return EINVAL;
  RcRequesterState& r = state_;
  if (r.sq.size() >= qp_.attributes().cap.max_send_wr) return ENOMEM;
  if (r.sq.empty() && core_.config.direct != nullptr && TryDirect(wr)) return 0;
  SendWqe w;
  w.wr = std::move(wr);
  r.sq.push_back(std::move(w));
  Progress(out);
  return 0;
}

bool RcRequester::TryDirect(const SendWr& wr) {
  if (qp_.type() != QpType::kRc || qp_.state() != QpState::kRts) return false;
  if (wr.opcode == SendOpcode::kSend || wr.opcode == SendOpcode::kSendWithImm) return TryDirectSend(wr);
  const bool write = wr.opcode == SendOpcode::kRdmaWrite;
  if (!write && wr.opcode != SendOpcode::kRdmaRead) return false;
  const uint64_t length = wr.TotalLength();
  if (length == 0 || length > kDirectMaxBytes || (!write && qp_.attributes().max_rd_atomic == 0)) return false;
  bool done;
  {
    // Our own region cannot be deregistered while the copy reads or writes it (IBTA 10.6.3.2).
    ReaderLock keys(core_.keys_mu());
    const uint32_t dest = qp_.attributes().dest_qp_num;
    if (write) {
      wire::ScratchList<std::span<const uint8_t>> pieces;
      done = core_.GatherRange(qp_, wr, 0, length, *pieces) &&
             core_.config.direct->Write(qp_.peer(), dest, qp_.qpn(), wr.rkey, wr.remote_addr, *pieces, length);
    } else {
      wire::ScratchList<std::span<uint8_t>> pieces;
      done = core_.ScatterRange(qp_, wr.sg_list, length, *pieces) &&
             core_.config.direct->Read(qp_.peer(), dest, qp_.qpn(), wr.rkey, wr.remote_addr, *pieces, length);
    }
  }
  if (!done) return false;
  core_.Count(write ? &DeviceCounters::rc_direct_writes : &DeviceCounters::rc_direct_reads);
  if (core_.tracing()) {
    core_.Trace(std::string("qp ") + Hex24(qp_.qpn()) + (write ? " direct write " : " direct read ") +
                std::to_string(length) + " bytes at rkey " + std::to_string(wr.rkey) + " of qp " +
                Hex24(qp_.attributes().dest_qp_num));
  }
  core_.CompleteSend(qp_, wr, WcStatus::kSuccess);
  return true;
}

bool RcRequester::TryDirectSend(const SendWr& wr) {
  const uint64_t length = wr.TotalLength();
  if (length > kDirectSendMaxBytes) return false;
  wire::DirectSend send;
  send.dest_qpn = qp_.attributes().dest_qp_num;
  send.src_qpn = qp_.qpn();
  send.with_imm = wr.opcode == SendOpcode::kSendWithImm;
  send.imm = wr.imm_data;
  send.solicited = (wr.flags & send_flags::kSolicited) != 0;
  bool done;
  {
    ReaderLock keys(core_.keys_mu());  // our pieces stay registered while they are copied into the ring
    wire::ScratchList<std::span<const uint8_t>> pieces;
    done = core_.GatherRange(qp_, wr, 0, length, *pieces) &&
           core_.config.direct->SendMessage(qp_.peer(), send, *pieces, length);
  }
  if (!done) return false;
  core_.Count(&DeviceCounters::rc_direct_sends);
  if (core_.tracing()) {
    core_.Trace(std::string("qp ") + Hex24(qp_.qpn()) + " direct send " + std::to_string(length) +
                " bytes into receive WQE " + std::to_string(send.index) + " of qp " + Hex24(send.dest_qpn));
  }
  core_.CompleteSend(qp_, wr, WcStatus::kSuccess);
  return true;
}

void RcRequester::ArmRetransmit(uint64_t& now_ns) {
  const uint64_t t = AckTimeoutNs(qp_.attributes().timeout);
  RcRequesterState& r = state_;
  if (t == 0) {
    r.retransmit_deadline_ns = 0;  // timeout 0: wait forever (IBTA 11.2.4.2)
    return;
  }
  if (now_ns == 0) now_ns = core_.Now();
  const uint64_t now = now_ns;
  r.retransmit_deadline_ns = now + t;
  r.probe_deadline_ns = 0;
  if (core_.config.early_retransmit) {
    {
      MutexLock lock(core_.paths_mu());
      const PathWindow& path = core_.PathOfLocked(qp_);
      r.probe_wait_ns = ProbeWaitNs(path);
      r.path_delivered_seen = path.delivered();
      r.path_silent_looks = 0;
    }
    r.tail_probes = 0;
    if (r.probe_wait_ns < t) r.probe_deadline_ns = now + r.probe_wait_ns;
  }
  // Only the timeout wakes a sleeping poller: it comes back on its own within 10 ms while packets flow (Engine's
  // tick, Device::RunTimers) and then finds the probe, which may be late but must not cost a wake-up per message.
  TimerArmed(r.retransmit_deadline_ns);
}

void RcRequester::TimeRoundTrip(uint32_t psn, uint64_t& now_ns) {
  RcRequesterState& r = state_;
  if (r.rtt_sent_ns == 0) {
    if (now_ns == 0) now_ns = core_.Now();
    r.rtt_sent_ns = now_ns;
    r.rtt_psn = psn;
    r.rtt_seq = r.newest_sent_seq;  // the packet just sent
  }
}

void RcRequester::AckedUpTo(uint32_t next) {
  RcRequesterState& r = state_;
  if (r.rtt_sent_ns == 0 || PsnDiff(next, r.rtt_psn) <= 0) return;
  const uint64_t now = core_.Now();
  {
    MutexLock lock(core_.paths_mu());
    PathWindow& path = core_.PathOfLocked(qp_);
    path.OnRoundTrip(now > r.rtt_sent_ns ? now - r.rtt_sent_ns : 1);
    path.OnDeliveredSent(r.rtt_seq);
  }
  r.rtt_sent_ns = 0;
}

uint64_t RcRequester::ProbeWaitNs(const PathWindow& path) const {
  const uint64_t srtt = path.srtt_ns();
  // Floors stretch with a slow machine (DeviceConfig::time_scale), as the ACK hold they must stay above does.
  const double scale = core_.config.time_scale;
  const uint64_t min_probe = uint64_t(double(kMinProbeNs) * scale);
  if (srtt == 0) return std::max(min_probe, uint64_t(double(kProbeRoundTrips * kInitialRttNs) * scale));
  // RFC 6298's RTO (srtt + 4 rttvar) where the round trip varies more than kProbeRoundTrips srtt allows for.
  return std::max({min_probe, kProbeRoundTrips * srtt, srtt + 4 * path.rttvar_ns()});
}

void RcRequester::GoBack(size_t index, uint32_t packet) {
  RcRequesterState& r = state_;
  r.cursor_wqe = index;
  r.cursor_pkt = packet;
  r.rtt_sent_ns = 0;  // what is timed now may be sent twice: its ACK would time the wrong sending (Karn)
}

bool RcRequester::Idle() const {
  // Every PSN sent acknowledged, and no READ or atomic still waiting for its response (an ACK of a later PSN covers
  // their PSNs without answering them, 9.7.5.1.2): otherwise a resend would restart the ACK timer of a request that
  // is never answered, and it would never time out. (A WRITE or SEND that waits for the path's window to send the
  // rest is idle: nothing of it is outstanding.)
  const RcRequesterState& r = state_;
  if (PsnDiff(r.sent_psn_next, r.acked_psn_next) > 0) return false;
  for (const SendWqe& w : r.sq) {
    if (!w.started()) break;
    if (!w.done() && (w.is_read() || w.is_atomic())) return false;
  }
  return true;
}

bool RcRequester::OnlyWaitsForPath() const {
  const RcRequesterState& r = state_;
  return r.waiting_for_path && PsnDiff(r.sent_psn_next, r.acked_psn_next) <= 0;
}

RcRequester::Silence RcRequester::SilenceMeansLoss() {
  MutexLock lock(core_.paths_mu());
  const PathWindow& path = core_.PathOfLocked(qp_);
  state_.path_silent_looks = path.delivered() == state_.path_delivered_seen ? state_.path_silent_looks + 1 : 0;
  state_.path_delivered_seen = path.delivered();
  if (path.DeliveredSentAfter(state_.newest_sent_seq)) return Silence::kLoss;
  if (state_.path_silent_looks >= kSilentLooks) return Silence::kMaybeLoss;
  for (uint32_t qpn : path.waiting())
    if (qpn != qp_.qpn()) return Silence::kNotLoss;
  return Silence::kMaybeLoss;
}

bool RcRequester::SendTailProbe(OutBatch& out) {
  RcRequesterState& r = state_;
  const uint32_t newest = PsnAdd(r.sent_psn_next, -1);
  const size_t j = WqeContaining(newest);
  if (j == r.sq.size() || !r.sq[j].in_flight() || r.sq[j].is_read() || r.sq[j].is_atomic()) return false;
  // The cursor goes back to it, and Progress sends it (a resend that reaches the newest packet asks for an ACK) and
  // then only what is new, as the windows allow.
  GoBack(j, static_cast<uint32_t>(PsnDiff(newest, r.sq[j].first_psn)));
  Progress(out);
  return true;
}

size_t RcRequester::WqeContaining(uint32_t psn) const {
  const RcRequesterState& r = state_;
  for (size_t i = 0; i < r.sq.size(); ++i) {
    const SendWqe& w = r.sq[i];
    if (!w.started()) break;
    if (PsnDiff(psn, w.first_psn) >= 0 && PsnDiff(psn, w.last_psn()) <= 0) return i;
  }
  return r.sq.size();
}

size_t RcRequester::OldestUnacknowledged(uint32_t* packet) const {
  const RcRequesterState& r = state_;
  size_t i = 0;
  while (i < r.sq.size() && r.sq[i].done()) ++i;
  if (i == r.sq.size() || !r.sq[i].started()) return r.sq.size();  // nothing outstanding
  // The first unacknowledged PSN within the WQE (a coalesced ACK may have covered its beginning).
  const SendWqe& w = r.sq[i];
  const int32_t into = PsnDiff(r.acked_psn_next, w.first_psn);
  *packet = w.is_read()                                                   ? w.read_next
            : (into > 0 && into < static_cast<int32_t>(w.npsn)) ? static_cast<uint32_t>(into)
                                                                          : 0;
  return i;
}

void RcRequester::TimerArmed(uint64_t deadline) {
  RcRequesterState& r = state_;
  if (!r.timer_listed) {
    r.timer_listed = true;
    core_.ListTimed(qp_.qpn());
  }
  core_.WakeForTimer(deadline);
}

void RcRequester::SendReadRequest(SendWqe& w, uint32_t from_pkt, OutBatch& out) {
  const uint32_t mtu = MtuBytes(qp_.attributes().path_mtu);
  const uint64_t off = uint64_t{from_pkt} * mtu;
  const uint64_t end = std::min(w.length, uint64_t{ReadSegmentEnd(w, from_pkt)} * mtu);
  wire::PacketSpec spec;
  spec.bth.opcode = wire::opcode::kRcRdmaReadRequest;
  spec.bth.dest_qp = qp_.attributes().dest_qp_num;
  spec.bth.psn = PsnAdd(w.first_psn, from_pkt);
  spec.bth.ack_req = true;
  // A re-issued READ asks only for what has not arrived yet (IBTA 9.7.4.1.4), up to the end of its segment.
  spec.reth = wire::Reth{w.wr.remote_addr + off, w.wr.rkey, static_cast<uint32_t>(end - std::min(off, end))};
  ToQpTransport(qp_, &w.wr, spec);  // XRC opcodes and XRCETH
  out.Add(core_.transport, spec, {}, core_.SourceOf(qp_.attributes().ah_attr), qp_.peer(), qp_.source_port());
}

void RcRequester::Congestion() {
  {
    MutexLock lock(core_.paths_mu());
    core_.PathOfLocked(qp_).OnCongestion();
  }
  core_.Count(&DeviceCounters::rc_congestion_signals);
}

void RcRequester::RerequestRead(SendWqe& w, OutBatch& out) {
  if (w.rerequested_from == w.read_next) return;  // already asked since this gap opened
  w.rerequested_from = w.read_next;
  Congestion();
  SendReadRequest(w, w.read_next, out);
}

// --- responses, as the completer classified them ---------------------------------------------------------------

namespace {
// rnr_retry 7 means "retry forever" (IBTA 9.7.5.2.8, ibv_modify_qp(3)); retry_cnt 7 means seven retries (C9-141),
// unless the device is configured as rxe behaves (DeviceConfig::retry_cnt_7_infinite).
constexpr int kInfiniteRnrRetry = 7;
}  // namespace

bool RcRequester::AckBefore(uint32_t limit, bool inclusive, OutBatch& out) {
  RcRequesterState& r = state_;
  bool progressed = false;
  // IBTA 9.7.5.1.2: an ACK, a READ response or an atomic ACK acknowledges all earlier requests. A READ or atomic
  // before it that got no response has lost it: ask again ("implied NAK", 9.7.5.2.2).
  for (size_t i = 0; i < r.sq.size(); ++i) {
    SendWqe& w = r.sq[i];
    if (!w.started()) break;
    const int32_t d = PsnDiff(w.last_psn(), limit);
    if (inclusive ? d > 0 : d >= 0) break;
    if (w.done()) continue;
    if (w.is_read()) {
      // Its missing responses were lost: ask for the rest of that segment again, once per gap, and go on -- the
      // requests after it were answered, so going back to resend them all would only multiply the traffic.
      RerequestRead(w, out);
      continue;
    }
    if (w.is_atomic()) {
      // Send it (and what follows) again -- once until a response moves the connection forward. Each resend draws
      // ACKs for the duplicates behind it; going back on each of them again multiplies the window with no time
      // passing, a storm when the atomic is never answered (the responder took its PSN for another request and has
      // no result to replay). After the one resend the ACK timer decides, spending the retry budget (C9-140).
      if (!r.implied_nak_resent) {
        r.implied_nak_resent = true;
        GoBack(i, 0);
      }
      break;
    }
    w.state = WqeState::kDone;
    progressed = true;
  }
  return progressed;
}

bool RcRequester::AdvanceAcked(uint32_t next) {
  RcRequesterState& r = state_;
  if (PsnDiff(next, r.acked_psn_next) <= 0) return false;
  r.acked_psn_next = next;
  AckedUpTo(next);
  return true;
}

void RcRequester::AfterResponse(bool progressed, OutBatch& out) {
  RcRequesterState& r = state_;
  const QpAttributes& a = qp_.attributes();
  if (progressed) {
    // Forward progress restores both retry budgets: they bound the retries of one request, not the connection's.
    r.retries_left = a.retry_cnt;
    r.rnr_retries_left = a.rnr_retry;
    r.retransmit_deadline_ns = 0;
    r.implied_nak_resent = false;
  }
  CompleteInOrder();
  if (qp_.state() == QpState::kErr) return;
  Progress(out);
  // Still waiting for something: keep the timer running.
  for (const SendWqe& w : r.sq) {
    if (w.in_flight()) {
      if (r.retransmit_deadline_ns == 0 && r.rnr_deadline_ns == 0) ArmRetransmit();
      break;
    }
  }
}

std::string_view RcRequester::OnAck(uint32_t psn, OutBatch& out) {
  bool progressed = AckBefore(psn, /*inclusive=*/true, out);
  progressed |= AdvanceAcked(PsnAdd(psn, 1));
  AfterResponse(progressed, out);
  return progressed ? "acknowledged" : "nothing new";
}

std::string_view RcRequester::OnRnrNak(uint32_t psn, uint8_t timer_code, OutBatch& out) {
  RcRequesterState& r = state_;
  bool progressed = AckBefore(psn, false, out);
  progressed |= AdvanceAcked(psn);
  const size_t i = WqeContaining(psn);
  if (i == r.sq.size()) {
    AfterResponse(progressed, out);
    return "stale";
  }
  if (r.rnr_retries_left == 0) {
    Fail(i, WcStatus::kRnrRetryExcErr);
    return "RNR retries exhausted: WQE fails";
  }
  if (qp_.attributes().rnr_retry != kInfiniteRnrRetry) --r.rnr_retries_left;
  GoBack(i, static_cast<uint32_t>(PsnDiff(psn, r.sq[i].first_psn)));
  r.retransmit_deadline_ns = 0;
  r.rnr_deadline_ns = core_.Now() + uint64_t{wire::RnrTimerMicros(timer_code)} * 1000;
  TimerArmed(r.rnr_deadline_ns);
  CompleteInOrder();
  return "waiting out the RNR timer, then go back";
}

std::string_view RcRequester::OnSequenceNak(uint32_t psn, OutBatch& out) {
  RcRequesterState& r = state_;
  bool progressed = AckBefore(psn, false, out);
  const size_t i = WqeContaining(psn);
  // A packet was lost on the way: the path is congested. Only a PSN that advanced is progress that restores the
  // retry budgets: a NAK repeating the PSN of an RNR-NAKed request must not refill rnr_retry.
  Congestion();
  progressed |= AdvanceAcked(psn);
  if (i < r.sq.size()) {
    GoBack(i, static_cast<uint32_t>(PsnDiff(psn, r.sq[i].first_psn)));
    if (r.sq[i].is_read()) r.sq[i].read_next = r.cursor_pkt;
  }
  r.retransmit_deadline_ns = 0;  // the resend re-arms the ACK timer
  AfterResponse(progressed, out);
  return "go back to the PSN";
}

std::string_view RcRequester::OnFatalNak(uint32_t psn, WcStatus status, OutBatch& out) {
  const bool progressed = AckBefore(psn, false, out);
  const size_t i = WqeContaining(psn);
  if (i == state_.sq.size()) {
    AfterResponse(progressed, out);
    return "stale";
  }
  Fail(i, status);
  return "WQE fails, QP to ERR";
}

std::string_view RcRequester::OnReadResponse(const wire::PacketView& p, OutBatch& out) {
  RcRequesterState& r = state_;
  const uint32_t psn = p.bth.psn;
  const size_t i = WqeContaining(psn);
  if (i == r.sq.size() || !r.sq[i].is_read() || r.sq[i].done()) return "duplicate or stale";
  SendWqe& w = r.sq[i];
  const uint32_t expected = PsnAdd(w.first_psn, w.read_next);
  if (psn != expected) {
    // A response was lost (9.7.5.2.2): ask again for the rest of the segment, once per gap -- the responses still
    // in flight behind the lost one would otherwise each trigger a whole new answer. Only the READ is asked again:
    // later requests were received, or their own timeout resends them.
    if (PsnDiff(psn, expected) > 0) {
      RerequestRead(w, out);
      return "a gap: READ asked again";
    }
    return "duplicate";
  }
  if (p.aeth && p.aeth->kind() != wire::AethKind::kAck) return "ignored (not an ACK syndrome)";
  AckBefore(w.first_psn, false, out);
  const uint32_t mtu = MtuBytes(qp_.attributes().path_mtu);
  const bool last_expected = w.read_next + 1 == ReadSegmentEnd(w, w.read_next);
  const bool is_last = p.info->position == wire::MsgPosition::kLast || p.info->position == wire::MsgPosition::kOnly;
  const uint64_t off = uint64_t{w.read_next} * mtu;
  const uint64_t want = std::min<uint64_t>(mtu, w.length - std::min(off, w.length));
  if (is_last != last_expected || p.payload.size() != want) {
    Fail(i, WcStatus::kBadRespErr);
    return "bad response: WQE fails";
  }
  const WcStatus st = core_.Scatter(qp_, w.wr.sg_list, off, p.payload);
  if (st != WcStatus::kSuccess) {
    Fail(i, st);
    return "local buffer refused: WQE fails";
  }
  ++w.read_next;
  if (w.read_next == w.npsn) w.state = WqeState::kDone;
  AdvanceAcked(PsnAdd(psn, 1));
  if (r.cursor_wqe == i && r.cursor_pkt < w.read_next) r.cursor_pkt = w.read_next;
  AfterResponse(/*progressed=*/true, out);
  return "placed";
}

std::string_view RcRequester::OnAtomicAck(const wire::PacketView& p, OutBatch& out) {
  RcRequesterState& r = state_;
  const uint32_t psn = p.bth.psn;
  const size_t i = WqeContaining(psn);
  if (i == r.sq.size() || !r.sq[i].is_atomic() || r.sq[i].done()) return "duplicate or stale";
  if (p.aeth && p.aeth->kind() != wire::AethKind::kAck) return "ignored (not an ACK syndrome)";
  bool progressed = AckBefore(psn, false, out);
  SendWqe& w = r.sq[i];
  uint8_t orig[8];
  std::memcpy(orig, &p.atomic_ack->original, 8);  // host order, as the local buffer holds a uint64_t
  const WcStatus st = core_.Scatter(qp_, w.wr.sg_list, 0, orig);
  if (st != WcStatus::kSuccess) {
    Fail(i, st);
    return "local buffer refused: WQE fails";
  }
  w.state = WqeState::kDone;
  progressed |= AdvanceAcked(PsnAdd(psn, 1));
  AfterResponse(progressed, out);
  return "original value placed";
}

// --- sending: one pass over the send queue from the cursor -----------------------------------------------------

// What one pass through Progress shares between its steps.
struct RcRequester::SendPass {
  PathWindow& path;  // the QP's path (the entry never moves; what it holds is read and changed under paths_mu)
  uint32_t mtu;
  wire::IpAddress src;
  wire::UdpEndpoint dst;
  uint16_t sport;
  // Nothing was unacknowledged when the pass began: the local ACK timer, if armed (it runs on while the requester
  // waits for the path's window), starts again with what is sent now (IBTA 9.7.6.1.3 times a request from its
  // sending). Seen with 1000 QPs: a requester that had waited 270 ms for the window timed out 3 ms after it resumed,
  // its ACK still queued.
  bool idle_before;
  bool sent = false;
  uint64_t now_ns = 0;  // read once, when first needed (TimeRoundTrip, ArmRetransmit)
  std::vector<std::span<const uint8_t>>& payload;  // the next packet's bytes, in registered memory (pass_payload_)
};

void RcRequester::Progress(OutBatch& out) {
  RcRequesterState& r = state_;
  const QpAttributes& a = qp_.attributes();
  if (a.qp_state != QpState::kRts && a.qp_state != QpState::kSqd) return;
  if (r.rnr_deadline_ns != 0) return;  // waiting out an RNR NAK
  if (r.cursor_wqe >= r.sq.size()) return;  // nothing to send (an ACK that completed the last WQE lands here)
  SendPass pass{[&]() -> PathWindow& {
                  MutexLock lock(core_.paths_mu());
                  return core_.PathOfLocked(qp_);
                }(),
                MtuBytes(a.path_mtu), core_.SourceOf(a.ah_attr), qp_.peer(), qp_.source_port(), Idle(), false, 0,
                pass_payload_};
  while (r.cursor_wqe < r.sq.size()) {
    SendWqe& w = r.sq[r.cursor_wqe];
    const PassStep step = w.is_local() && !w.started() ? RunLocalOp(w) : SendFromCursor(w, pass, out);
    if (step == PassStep::kFailed) return;
    if (step == PassStep::kStop) break;
    if (step == PassStep::kSent) pass.sent = true;
  }
  if (pass.sent && (r.retransmit_deadline_ns == 0 || pass.idle_before)) ArmRetransmit(pass.now_ns);
  // A held ACK of this QP's responder follows the requests just queued (AckTiming::kHeld).
  if (pass.sent && qp_.responder().ack_held()) qp_.responder().SendHeldAck(out);
}

// A local operation takes no PSN: it happens when the queue reaches it and completes in order.
RcRequester::PassStep RcRequester::RunLocalOp(SendWqe& w) {
  RcRequesterState& r = state_;
  if (qp_.attributes().qp_state == QpState::kSqd) return PassStep::kStop;
  const WcStatus st = core_.ExecuteLocalOp(qp_, w.wr);
  if (st != WcStatus::kSuccess) {
    Fail(r.cursor_wqe, st);
    return PassStep::kFailed;
  }
  w.state = WqeState::kDone;
  w.first_psn = qp_.attributes().sq_psn;
  w.npsn = 0;
  ++r.cursor_wqe;
  r.cursor_pkt = 0;
  CompleteInOrder();
  return PassStep::kNothingSent;
}

uint32_t RcRequester::OutstandingReadsAndAtomics() const {
  uint32_t n = 0;
  for (const SendWqe& w : state_.sq)
    if (w.in_flight() && (w.is_read() || w.is_atomic())) ++n;
  return n;
}

// A WQE not started yet: whether it may start now (SQD, max_rd_atomic, the fence), its local buffers (a bad lkey is
// a local protection error, IBTA 10.6.3.1; a READ or atomic needs local write access to land its data), its PSNs.
RcRequester::PassStep RcRequester::StartWqe(SendWqe& w, uint32_t mtu) {
  RcRequesterState& r = state_;
  QpAttributes& a = qp_.mutable_attributes();
  if (a.qp_state == QpState::kSqd) return PassStep::kStop;  // SQD: nothing new starts
  const bool rd_atomic = w.is_read() || w.is_atomic();
  if (rd_atomic && OutstandingReadsAndAtomics() >= std::max<uint32_t>(a.max_rd_atomic, 1)) return PassStep::kStop;
  // IBV_SEND_FENCE (IBTA 10.8.3.3): wait until every earlier READ and atomic has completed.
  if ((w.wr.flags & send_flags::kFence) && OutstandingReadsAndAtomics() > 0) return PassStep::kStop;
  w.length = w.wr.TotalLength();
  if (w.length > core_.config.limits.max_msg_sz) {
    Fail(r.cursor_wqe, WcStatus::kLocLenErr);
    return PassStep::kFailed;
  }
  if (!(w.wr.flags & send_flags::kInline)) {
    const uint32_t needed = rd_atomic ? access::kLocalWrite : 0;
    ReaderLock keys(core_.keys_mu());
    for (const Sge& sge : w.wr.sg_list) {
      if (sge.length == 0 || core_.keys().CheckLocal(sge.lkey, qp_.init().pd, sge.addr, sge.length, needed).ok())
        continue;
      keys.Unlock();
      Fail(r.cursor_wqe, WcStatus::kLocProtErr);
      return PassStep::kFailed;
    }
  }
  w.npsn = w.is_atomic() ? 1 : PacketsFor(w.length, mtu);
  w.first_psn = a.sq_psn;
  a.sq_psn = PsnAdd(a.sq_psn, w.npsn);
  w.state = WqeState::kInFlight;
  r.cursor_pkt = 0;
  return PassStep::kNothingSent;
}

// The window shared by every QP towards this peer is full: wait to be woken as it opens (retransmissions of what is
// already in flight never wait). Threads sending for other QPs towards it meanwhile may each put one more packet in
// flight than the window allows: it is a bound on queueing, not on correctness. So may a requester whose newest
// packet did not ask for an ACK: this one does (*force_ack_req), and it stops after it
// (RcRequesterState::tail_asks_ack()). False: stop here.
bool RcRequester::PathLetsNewPacketGo(PathWindow& path, bool* force_ack_req) {
  RcRequesterState& r = state_;
  MutexLock lock(core_.paths_mu());
  if (path.MaySend()) return true;
  if (!r.tail_asks_ack()) {
    *force_ack_req = true;
    return true;
  }
  if (!r.waiting_for_path) {
    r.waiting_for_path = true;
    path.waiting().push_back(qp_.qpn());
    core_.Count(&DeviceCounters::rc_path_waits);
  }
  return false;
}

// The packet at the cursor of WQE `w` (started here if it is not), if the QP's window and the path's let it go.
RcRequester::PassStep RcRequester::SendFromCursor(SendWqe& w, SendPass& pass, OutBatch& out) {
  RcRequesterState& r = state_;
  if (!w.started()) {
    const PassStep start = StartWqe(w, pass.mtu);
    if (start != PassStep::kNothingSent) return start;
  }
  const uint32_t psn = PsnAdd(w.first_psn, r.cursor_pkt);
  if (PsnDiff(psn, r.acked_psn_next) >= kWindowPackets) return PassStep::kStop;  // the QP's window is full
  const bool is_new = PsnDiff(psn, r.sent_psn_next) >= 0;  // not sent before (go-back-N resends are not)
  bool force_ack_req = false;
  if (is_new && !PathLetsNewPacketGo(pass.path, &force_ack_req)) return PassStep::kStop;
  if (w.is_read()) return SendReadSegment(w, pass, out);
  if (w.is_atomic()) {
    SendAtomic(w, psn, is_new, pass, out);
    return PassStep::kSent;
  }
  return SendMessagePacket(w, psn, is_new, force_ack_req, pass, out);
}

// Marks PSNs before `next` as sent and charges what is new to the path at once, so the next packet sees the window
// as it is.
void RcRequester::SentUpTo(uint32_t next, SendPass& pass) {
  RcRequesterState& r = state_;
  if (PsnDiff(next, r.sent_psn_next) > 0) r.sent_psn_next = next;
  MutexLock lock(core_.paths_mu());
  r.newest_sent_seq = pass.path.NoteSent();
  ChargeLocked(pass.path);
}

void RcRequester::AdvanceCursor(uint32_t packets_in_wqe) {
  RcRequesterState& r = state_;
  if (r.cursor_pkt >= packets_in_wqe) {
    ++r.cursor_wqe;
    r.cursor_pkt = 0;
  }
}

// A READ asks for a segment of its responses at a time: what has arrived is never asked for again (go-back-N may
// pass a READ already answered in full), and the next segment waits for the previous one.
RcRequester::PassStep RcRequester::SendReadSegment(SendWqe& w, SendPass& pass, OutBatch& out) {
  RcRequesterState& r = state_;
  if (w.done()) {
    ++r.cursor_wqe;
    r.cursor_pkt = 0;
    return PassStep::kNothingSent;
  }
  r.cursor_pkt = std::max(r.cursor_pkt, w.read_next);
  if (r.cursor_pkt > w.read_next) return PassStep::kStop;
  const uint32_t end = ReadSegmentEnd(w, r.cursor_pkt);
  // A READ request asks for its responses, which acknowledge what precedes it.
  if (PsnDiff(PsnAdd(w.first_psn, end), r.sent_psn_next) > 0) r.packets_since_ack_req = 0;
  SendReadRequest(w, r.cursor_pkt, out);
  SentUpTo(PsnAdd(w.first_psn, end), pass);
  r.cursor_pkt = end;
  AdvanceCursor(w.npsn);
  return PassStep::kSent;
}

void RcRequester::SendAtomic(SendWqe& w, uint32_t psn, bool is_new, SendPass& pass, OutBatch& out) {
  RcRequesterState& r = state_;
  const bool cas = w.wr.opcode == SendOpcode::kAtomicCmpAndSwp;
  wire::PacketSpec spec;
  spec.bth.dest_qp = qp_.attributes().dest_qp_num;
  spec.bth.psn = psn;
  spec.bth.opcode = cas ? wire::opcode::kRcCompareSwap : wire::opcode::kRcFetchAdd;
  spec.bth.ack_req = true;
  spec.atomic =
      wire::AtomicEth{w.wr.remote_addr, w.wr.rkey, cas ? w.wr.swap : w.wr.compare_add, cas ? w.wr.compare_add : 0};
  ToQpTransport(qp_, &w.wr, spec);  // XRC opcodes and XRCETH
  out.Add(core_.transport, spec, {}, pass.src, pass.dst, pass.sport);
  if (is_new) r.packets_since_ack_req = 0;  // it asks for the atomic ACK
  SentUpTo(PsnAdd(psn, 1), pass);
  ++r.cursor_wqe;
  r.cursor_pkt = 0;
}

// Whether the WQE after the cursor's is a SEND or WRITE that has not started and waits for nothing (no fence, no
// READ/atomic limit, not a local operation, which completes only after the ACKs of those before it): this pass then
// goes on to it, and its packets ask for the ACK -- the last one sent at the latest, where the requester stops -- so
// the message before need not. With 64 KiB WRITEs one ACK per message cost the receiver a send and the sender a
// receive for every 16 packets.
bool RcRequester::NextMessageFollows() const {
  const RcRequesterState& r = state_;
  if (qp_.attributes().qp_state != QpState::kRts || r.cursor_wqe + 1 >= r.sq.size()) return false;
  const SendWqe& n = r.sq[r.cursor_wqe + 1];
  return !n.started() && !n.is_read() && !n.is_atomic() && !(n.wr.flags & send_flags::kFence) && !n.is_local();
}

// Whether the packet before `next_psn` should ask for an ACK because the requester will stop after it -- the QP's
// window or the path's is full -- else nothing would acknowledge what it has in flight until a timeout. Charges the
// packet to the path in the same step, before it is built: one that cannot be built fails the QP, which uncharges it
// (Fail -> EnterError -> Charge).
bool RcRequester::StopsAfterAndCharge(uint32_t next_psn, bool is_new, SendPass& pass) {
  RcRequesterState& r = state_;
  bool stops_after = PsnDiff(next_psn, r.acked_psn_next) >= kWindowPackets;
  MutexLock lock(core_.paths_mu());
  if (!stops_after && PsnDiff(next_psn, r.sent_psn_next) >= 0)
    stops_after = pass.path.in_flight() + (is_new ? 1 : 0) >= pass.path.window();
  if (is_new) r.sent_psn_next = next_psn;
  r.newest_sent_seq = pass.path.NoteSent();
  ChargeLocked(pass.path);
  return stops_after;
}

// One packet of a SEND or WRITE (every variant is defined on RC, IBTA table 38), its payload gathered from registered
// memory while the key table cannot change (DeviceCore::keys_mu).
RcRequester::PassStep RcRequester::SendMessagePacket(SendWqe& w, uint32_t psn, bool is_new, bool force_ack_req,
                                                     SendPass& pass, OutBatch& out) {
  RcRequesterState& r = state_;
  const SendOpcodeInfo& info = *FindSendOpcode(w.wr.opcode);
  const bool is_send = info.kind == SendOpcodeInfo::Kind::kSend;
  const uint32_t k = r.cursor_pkt;
  const bool first = k == 0, last = k + 1 == w.npsn;
  wire::PacketSpec spec;
  spec.bth.dest_qp = qp_.attributes().dest_qp_num;
  spec.bth.psn = psn;
  spec.bth.opcode = *wire::MessageOpcode(wire::TransportKind::kRc,
                                         is_send ? wire::Operation::kSend : wire::Operation::kRdmaWrite,
                                         wire::PositionInMessage(k, w.npsn), info.immediate, info.invalidate);
  if (!is_send && first) spec.reth = wire::Reth{w.wr.remote_addr, w.wr.rkey, static_cast<uint32_t>(w.length)};
  spec.bth.solicited = last && (w.wr.flags & send_flags::kSolicited);
  const uint32_t next_psn = PsnAdd(psn, 1);
  const bool stops_after = StopsAfterAndCharge(next_psn, is_new, pass);
  if (is_new) {
    spec.bth.ack_req = (last && !NextMessageFollows()) || r.packets_since_ack_req + 1 >= kAckReqEvery ||
                       stops_after || force_ack_req;
    r.packets_since_ack_req = spec.bth.ack_req ? 0 : r.packets_since_ack_req + 1;
    if (spec.bth.ack_req) TimeRoundTrip(psn, pass.now_ns);
  } else {
    // Go-back-N resends, and tail probes: the newest packet sent asks for an ACK when it goes again.
    spec.bth.ack_req = last || (k % kAckReqEvery == kAckReqEvery - 1) || stops_after ||
                       PsnDiff(next_psn, r.sent_psn_next) >= 0;
  }
  if (last && info.immediate) spec.imm = wire::ImmDt{w.wr.imm_data};
  if (last && info.invalidate) spec.ieth = wire::Ieth{w.wr.invalidate_rkey};
  const uint64_t off = uint64_t{k} * pass.mtu;
  const uint64_t len = std::min<uint64_t>(pass.mtu, w.length - std::min(off, w.length));
  ToQpTransport(qp_, &w.wr, spec);  // XRC opcodes and XRCETH
  {
    ReaderLock keys(core_.keys_mu());
    if (!core_.GatherRange(qp_, w.wr, off, len, pass.payload) ||
        !out.AddGathered(core_.transport, spec, pass.payload, pass.src, pass.dst, pass.sport)) {
      keys.Unlock();
      Fail(r.cursor_wqe, WcStatus::kLocProtErr);  // deregistered (or unmapped) after the WQE started
      return PassStep::kFailed;
    }
  }
  ++r.cursor_pkt;
  AdvanceCursor(w.npsn);
  return PassStep::kSent;
}

void RcRequester::Fail(size_t index, WcStatus status) {
  RcRequesterState& r = state_;
  // Everything before `index` has been sent (the cursor is past it): it completes before the failure.
  for (size_t i = 0; i < index && i < r.sq.size(); ++i) r.sq[i].state = WqeState::kDone;
  if (index < r.sq.size()) r.sq[index].status = status;
  // Completed in order up to the failed WQE (one that failed before it started, a bad lkey or a length above
  // max_msg_sz, with its status too). The error moves the QP to the error state and what is left is flushed (IBTA
  // 10.8.3.3 / 11.6.2), even a WQE the responder has acknowledged meanwhile: its success cannot be reported behind
  // an error -- the acknowledgement may be for a request the responder took for a duplicate and never executed.
  for (size_t i = 0; i <= index && !r.sq.empty(); ++i) {
    SendWqe w = std::move(r.sq.front());
    r.sq.pop_front();
    core_.CompleteSend(qp_, w.wr, w.status);
  }
  r.cursor_wqe = 0;
  r.cursor_pkt = 0;
  core_.EnterError(qp_);
}

void RcRequester::CompleteInOrder() {
  RcRequesterState& r = state_;
  while (!r.sq.empty() && r.sq.front().done()) {
    SendWqe w = std::move(r.sq.front());
    r.sq.pop_front();
    if (r.cursor_wqe > 0) {
      --r.cursor_wqe;
    } else {
      r.cursor_pkt = 0;  // the cursor was inside the WQE just completed (a late ACK after go-back-N): next one
    }
    core_.CompleteSend(qp_, w.wr, w.status);
  }
  QpAttributes& a = qp_.mutable_attributes();
  const bool idle = r.sq.empty() || !r.sq.front().started();
  if (idle) r.retransmit_deadline_ns = 0;
  if (idle && a.qp_state == QpState::kSqd && a.sq_draining) {
    a.sq_draining = false;
    if (r.drained_event_pending) {
      r.drained_event_pending = false;
      core_.Raise({AsyncEventType::kSqDrained, &qp_});
    }
  }
}

// --- QP transitions ---------------------------------------------------------------------------------------------

void RcRequester::Reset() {
  Charge();  // the QP is in RESET: nothing of it is in flight any more
  state_ = RcRequesterState{};
}

void RcRequester::Start(bool from_sqd) {
  const QpAttributes& a = qp_.attributes();
  state_.retries_left = a.retry_cnt;
  state_.rnr_retries_left = a.rnr_retry;
  if (!from_sqd) state_.acked_psn_next = state_.sent_psn_next = a.sq_psn;
}

void RcRequester::StartDraining(bool notify) {
  state_.drained_event_pending = notify;
  qp_.mutable_attributes().sq_draining = true;
  CompleteInOrder();  // IBV_EVENT_SQ_DRAINED at once when nothing is in flight
}

void RcRequester::Flush() {
  RcRequesterState& r = state_;
  for (SendWqe& w : r.sq) {
    const WcStatus status = w.status == WcStatus::kSuccess ? WcStatus::kWrFlushErr : w.status;
    core_.Complete(qp_.init().send_cq, core_.SendCompletion(qp_, w.wr, status));
  }
  r.sq.clear();
  r.cursor_wqe = 0;
  r.cursor_pkt = 0;
  r.retransmit_deadline_ns = r.rnr_deadline_ns = 0;
  r.rtt_sent_ns = 0;
}

// --- timers ------------------------------------------------------------------------------------------------------

void RcRequester::TraceTimer(std::string_view what, uint32_t psn) const {
  if (!core_.tracing()) return;
  core_.Trace("requester qp " + Hex24(qp_.qpn()) + " psn " + Hex24(psn) + ": " + std::string(what) + " (" +
              std::to_string(state_.retries_left) + " retries left)");
}

uint64_t RcRequester::NextDeadline() const {
  const RcRequesterState& r = state_;
  const uint64_t probe = r.retransmit_deadline_ns != 0 ? r.probe_deadline_ns : 0;
  return wire::EarlierDeadline(wire::EarlierDeadline(r.retransmit_deadline_ns, r.rnr_deadline_ns), probe);
}

void RcRequester::OnTimers(uint64_t now, OutBatch& out) {
  RcRequesterState& r = state_;
  if (qp_.state() != QpState::kRts && qp_.state() != QpState::kSqd) {
    r.retransmit_deadline_ns = r.rnr_deadline_ns = 0;
    return;
  }
  if (r.rnr_deadline_ns != 0 && now >= r.rnr_deadline_ns) {
    r.rnr_deadline_ns = 0;
    TraceTimer("RNR timer over: sending again", PsnAdd(r.acked_psn_next, 0));
    Progress(out);
    if (r.retransmit_deadline_ns == 0) ArmRetransmit();
  }
  if (r.retransmit_deadline_ns == 0) return;
  if (now < r.retransmit_deadline_ns) {
    if (r.probe_deadline_ns == 0 || now < r.probe_deadline_ns) return;
    // Early retransmission (DeviceConfig::early_retransmit): nothing heard for a few round trips.
    r.probe_wait_ns *= 2;
    r.probe_deadline_ns = now + r.probe_wait_ns < r.retransmit_deadline_ns ? now + r.probe_wait_ns : 0;
    uint32_t packet = 0;
    const size_t i = OldestUnacknowledged(&packet);
    if (i == r.sq.size() || OnlyWaitsForPath()) return;
    const Silence silence = SilenceMeansLoss();
    if (silence == Silence::kNotLoss) return;
    if (silence == Silence::kMaybeLoss && r.tail_probes < kTailProbes && SendTailProbe(out)) {
      ++r.tail_probes;
      core_.Count(&DeviceCounters::rc_tail_probes);
      TraceTimer("nothing heard for a few round trips: tail probe", PsnAdd(r.sent_psn_next, -1));
      return;
    }
    core_.Count(&DeviceCounters::rc_early_retransmits);
    TraceTimer("nothing heard for a few round trips: early go-back-N", PsnAdd(r.sq[i].first_psn, packet));
    Congestion();
    GoBack(i, packet);
    Progress(out);
    return;
  }
  r.retransmit_deadline_ns = 0;
  uint32_t packet = 0;
  const size_t i = OldestUnacknowledged(&packet);
  if (i == r.sq.size()) return;  // nothing outstanding
  if (OnlyWaitsForPath()) {
    // Everything it sent is acknowledged and it waits for its turn in the path's window, not for the peer: no retry
    // is spent, the timer just runs again.
    ArmRetransmit();
    return;
  }
  // Local ACK timeout (IBTA 9.7.6.1.3 / C9-140): spend a retry, then go back to the oldest unacknowledged WQE.
  if (r.retries_left == 0) {
    TraceTimer("local ACK timeout, no retry left: WQE fails with RETRY_EXC_ERR", PsnAdd(r.sq[i].first_psn, packet));
    Fail(i, WcStatus::kRetryExcErr);
    return;
  }
  if (!(core_.config.retry_cnt_7_infinite && qp_.attributes().retry_cnt == 7)) --r.retries_left;
  core_.Count(&DeviceCounters::rc_retransmit_timeouts);
  TraceTimer("local ACK timeout: a retry spent, go-back-N", PsnAdd(r.sq[i].first_psn, packet));
  Congestion();
  GoBack(i, packet);
  Progress(out);
  if (r.retransmit_deadline_ns == 0) ArmRetransmit();
}

}  // namespace uroce::emu
