// The RC requester of one QP (IBTA vol1 9.7.1-9.7.4): turns send WQEs into packets within the QP's window and the
// path's, gives each WQE its PSN range when it starts, and goes back to the oldest unacknowledged WQE (go-back-N) on a
// local ACK timeout, a PSN sequence error NAK, or after an RNR NAK's delay. Completing WQEs in order is here too
// (CompleteInOrder), since a local operation completes when the requester reaches it. An XRC initiator is this
// requester; its packets take XRC opcodes and the XRCETH on the way out (ToQpTransport).
//
// Every method runs with its QP's lock held (QueuePair::mutex(), device_core.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "emu/rc_state.h"
#include "emu/transport_object.h"
#include "emu/types.h"
#include "emu/work_request.h"
#include "wire/packet.h"

namespace uroce::emu {

class PathWindow;
struct OutBatch;

class RcRequester : private TransportObject {
 public:
  // Early retransmission (DeviceConfig::early_retransmit) waits kProbeRoundTrips smoothed round trips of the path
  // without an ACK, or RFC 6298's srtt + 4 rttvar if longer, at least kMinProbeNs (above RcResponder::kAckHoldNs
  // with room), assuming kInitialRttNs before the first sample; the wait doubles after each early retransmission
  // until the timeout. One estimate per path, not per QP: 256 QPs that each timed their own packets (behind the
  // others' whole window) and waited four of their round trips went back early ~1200 times in 5120 messages without
  // a loss.
  static constexpr uint64_t kProbeRoundTrips = 4;
  static constexpr uint64_t kMinProbeNs = 200'000;
  static constexpr uint64_t kInitialRttNs = 250'000;
  // Probes in a row that must find nothing delivered on the whole path before its silence counts as a loss while
  // others wait for its window (SilenceMeansLoss).
  static constexpr uint32_t kSilentLooks = 2;
  // Silence that may be a loss is answered first by kTailProbes tail probes (SendTailProbe), one per probe, before
  // the go-back-N. A silent peer is most often not a lost one: a uroce peer whose application stops polling for a
  // while (rstream -T v verifying each megabyte) leaves what arrives unread until its lease ends (up to 1 ms), and
  // each go-back-N at the first probe then sent up to a window again and halved it: ~2,600 early retransmissions
  // and ~50,000 duplicate packets per side in an rstream -S 1000000 -C 2000 -T v run without a loss. Two probes take
  // the go-back-N past that (probes after 1, 3 and 7 waits); a real loss is answered by the first probe's NAK.
  static constexpr uint32_t kTailProbes = 2;

  // The largest RDMA WRITE or READ carried out directly in another process's memory (DeviceConfig::direct); larger
  // ones go as packets, so that one copy never holds the QP (and the target's revocations) for long.
  static constexpr uint64_t kDirectMaxBytes = uint64_t{1} << 20;
  // The largest SEND carried into another process's ring as a direct SEND: its bytes are copied into the ring and
  // out of it (the target places them), so a large one gains nothing over packets and would take room a window of
  // packets needs.
  static constexpr uint64_t kDirectSendMaxBytes = uint64_t{64} << 10;

  RcRequester(DeviceCore& core, QueuePair& qp) : TransportObject(core, qp) {}

  RcRequesterState& state() { return state_; }
  const RcRequesterState& state() const { return state_; }

  // Queues a send WR (post-time checks of RC: EINVAL for an operation RC cannot carry so, ENOMEM when the send queue
  // is full) and sends what the windows allow.
  int Post(SendWr& wr, OutBatch& out);
  // Sends what the QP's window and the path's allow, from the cursor on.
  void Progress(OutBatch& out);

  // --- QP transitions (Device::ModifyQp) ----------------------------------------------------------------------------
  // RESET: nothing is queued or in flight any more.
  void Reset();
  // Entering RTS: retry budgets from the QP's attributes; from RTR the PSNs start at sq_psn.
  void Start(bool from_sqd);
  // RTS -> SQD (IBTA 11.2.4.2): nothing new starts; IBV_EVENT_SQ_DRAINED once those in flight are done.
  void StartDraining(bool notify);
  // The error state: WQEs not completed complete flushed, in order (IBTA 10.3.1, 11.4.4).
  void Flush();

  // --- the path's shared window (congestion.h) -----------------------------------------------------------------------
  // Brings the path's count of packets in flight up to date with the QP's (none unless it can send).
  void Charge();
  void ChargeLocked(PathWindow& path);  // `path` is the QP's, with DeviceCore::paths_mu held
  // Whether it stopped for the path's window: the path's waiting list names it until it is woken (Progress).
  bool TakeWaitingForPath();

  // --- timers (Device::RunTimers) ------------------------------------------------------------------------------------
  void OnTimers(uint64_t now, OutBatch& out);
  uint64_t NextDeadline() const;  // 0: none armed
  // Listed in DeviceCore::timed_qps (RunTimers visits it): cleared by the timer pass before it visits.
  bool timer_listed() const { return state_.timer_listed; }
  void set_timer_listed(bool listed) { state_.timer_listed = listed; }

  // --- responses, as the completer (rc_completer.h) classified them --------------------------------------------------
  // Each changes only this requester's state and returns what it did, for the decision trace.
  bool HasSent(uint32_t psn) const { return PsnDiff(psn, state_.sent_psn_next) < 0; }
  // An ACK: everything up to `psn` is acknowledged (IBTA 9.7.5.1.2, coalesced ACKs).
  std::string_view OnAck(uint32_t psn, OutBatch& out);
  // Receiver not ready at `psn`: wait the timer the NAK names, then send from there (9.7.5.2.8), within rnr_retry.
  std::string_view OnRnrNak(uint32_t psn, uint8_t timer_code, OutBatch& out);
  // PSN sequence error: the responder expects `psn`; resend from there at once, spending no retry (9.7.5.2.1).
  std::string_view OnSequenceNak(uint32_t psn, OutBatch& out);
  // A NAK that ends the connection: the WQE holding `psn` fails with `status`.
  std::string_view OnFatalNak(uint32_t psn, WcStatus status, OutBatch& out);
  std::string_view OnReadResponse(const wire::PacketView& p, OutBatch& out);
  std::string_view OnAtomicAck(const wire::PacketView& p, OutBatch& out);

  // WQE `index` fails with `status`: what precedes it completes, then the QP enters the error state.
  void Fail(size_t index, WcStatus status);
  // Completes the done WQEs at the head of the queue, in order (IBTA 9.7.5.1.2).
  void CompleteInOrder();

  // How long early retransmission waits without an ACK on `path` (kProbeRoundTrips above).
  uint64_t ProbeWaitNs(const PathWindow& path) const;

 private:
  // Carries out `wr`, an RDMA WRITE or READ posted while nothing of the QP is outstanding, directly in the memory of
  // its peer, another process of the host (DeviceConfig::direct), and completes it. False: it goes as packets, which
  // give whatever error is due. The target's table allows only what its responder would execute, and with nothing
  // outstanding no earlier message can be overtaken (IBTA 9.5: RC executes in order).
  bool TryDirect(const SendWr& wr);
  // A SEND (with immediate) likewise, as a direct SEND into the peer's ring once its receive window shows the WQE it
  // will take, long enough (wire/direct_access.h); completed at once. SEND with invalidate always goes as packets.
  bool TryDirectSend(const SendWr& wr);
  // Arms the local ACK timer (and the early-retransmission probe) from now. `now_ns`: the time of this pass through
  // the requester, read here when still 0 (one clock reading serves a pass's timers and round-trip sample).
  void ArmRetransmit(uint64_t& now_ns);
  void ArmRetransmit() {
    uint64_t now_ns = 0;
    ArmRetransmit(now_ns);
  }
  // A timer was armed for `deadline`: RunTimers visits this QP, and the poller is woken if it would sleep past it.
  void TimerArmed(uint64_t deadline);
  // An ACK up to (not including) `next` arrived: ends the timing of a packet before it.
  void AckedUpTo(uint32_t next);
  // Moves the cursor back to packet `packet` of WQE `index` (go-back-N) and drops the timed packet.
  void GoBack(size_t index, uint32_t packet);
  // The started WQE whose PSNs include `psn` (for a READ, its response packets'); sq.size() when none does.
  size_t WqeContaining(uint32_t psn) const;
  // After a lost READ response: asks again from the first missing one, once per gap, and cuts the path's window.
  void RerequestRead(SendWqe& w, OutBatch& out);
  void Congestion();  // a loss seen by this requester: the path's window is cut
  // Every WQE wholly before `limit` (or up to it, `inclusive`) that needs nothing more than an ACK is done; a READ or
  // atomic among them that got no answer lost it and is asked again. Whether any WQE became done.
  bool AckBefore(uint32_t limit, bool inclusive, OutBatch& out);
  // Every PSN before `next` is acknowledged; whether that moved.
  bool AdvanceAcked(uint32_t next);
  // After a response: forward progress restores the retry budgets; done WQEs complete; what may be sent is; the
  // timer keeps running while something waits.
  void AfterResponse(bool progressed, OutBatch& out);

  // --- one pass of Progress over the send queue --------------------------------------------------------------------
  struct SendPass;
  enum class PassStep : uint8_t {
    kSent,         // a packet (or a READ segment's request) went out; the pass goes on
    kNothingSent,  // the cursor moved without sending (a local operation, a WQE started, a READ already answered)
    kStop,         // wait: a window is full, SQD, max_rd_atomic, a fence
    kFailed,       // a WQE failed and the QP entered the error state: the pass is over
  };
  PassStep RunLocalOp(SendWqe& w);
  PassStep StartWqe(SendWqe& w, uint32_t mtu);
  PassStep SendFromCursor(SendWqe& w, SendPass& pass, OutBatch& out);
  PassStep SendReadSegment(SendWqe& w, SendPass& pass, OutBatch& out);
  void SendAtomic(SendWqe& w, uint32_t psn, bool is_new, SendPass& pass, OutBatch& out);
  PassStep SendMessagePacket(SendWqe& w, uint32_t psn, bool is_new, bool force_ack_req, SendPass& pass,
                             OutBatch& out);
  bool PathLetsNewPacketGo(PathWindow& path, bool* force_ack_req);
  bool StopsAfterAndCharge(uint32_t next_psn, bool is_new, SendPass& pass);
  bool NextMessageFollows() const;
  void SentUpTo(uint32_t next, SendPass& pass);
  void AdvanceCursor(uint32_t packets_in_wqe);
  uint32_t OutstandingReadsAndAtomics() const;

  // A timer's decision, for the decision trace: `what` it did, from `psn`.
  void TraceTimer(std::string_view what, uint32_t psn) const;

  // Round-trip timing: `psn` (sent for the first time, asking for an ACK) is timed unless one is already. `now_ns`
  // as for ArmRetransmit.
  void TimeRoundTrip(uint32_t psn, uint64_t& now_ns);
  // The oldest started WQE not done and, in *packet, its first unacknowledged packet (a READ: the first response
  // missing); sq.size() when nothing is outstanding.
  size_t OldestUnacknowledged(uint32_t* packet) const;
  // Everything sent is acknowledged and the requester waits for room in the path's window, not for its peer.
  bool Idle() const;  // nothing sent is waiting for an answer
  bool OnlyWaitsForPath() const;
  // Whether no ACK for a few round trips (the early-retransmission probe) means a loss. Not when other requesters
  // wait for the window of the QP's path: it is full, and this QP's packets may sit behind theirs for longer than
  // any round trip measured before (without this rule, 256 QPs went back early ~1100-1800 times in 5120 messages
  // without a loss) -- unless a packet sent after all of this QP's has been acknowledged meanwhile
  // (PathWindow::NoteSent), or nothing at all was delivered on the path at kSilentLooks probes in a row (each twice
  // the wait before it): then this QP's packets or their ACK were lost, and the others wait behind it and those
  // silent with it. Without these exceptions a lost tail of one of 256 QPs held the whole path until the local ACK
  // timeout (67 ms): ~1400 timeouts in an ib_write_bw -q 256 under 1% loss, which ran at 42 MB/s. One silent look
  // was not enough: a receiver held off its CPU for longer than the probe (2 cores, 256 QPs) passed for a lost path
  // 0-13 times in no-loss runs of 5,120 messages, and each early retransmission cuts the window.
  enum class Silence : uint8_t {
    kNotLoss,    // others' packets may be ahead: wait on
    kMaybeLoss,  // no sign either way: probe the tail first
    kLoss,       // a packet sent after this QP's was acknowledged: they are lost
  };
  Silence SilenceMeansLoss();
  // A tail loss probe (RFC 8985 section 7, for a go-back-N peer): the newest packet sent goes again alone, asking
  // for an ACK, and the responder's answer tells what the silence was. If an earlier packet was lost the probe
  // arrives out of sequence and draws a PSN sequence error NAK (9.7.5.1.1), which sends everything from the gap again
  // (a peer that NAKed that gap already stays silent: the next probe or the go-back-N follows); if all arrived and
  // only their ACK is late or lost, the duplicate is acknowledged with the newest PSN (9.7.5.1.3) and nothing else is
  // sent again. False, sending nothing, when the newest packet is a READ or atomic request (their duplicates are
  // executed or answered again, which the go-back-N does anyway).
  bool SendTailProbe(OutBatch& out);
  // A READ request for `w`'s response packets from `from_pkt` to the end of that segment.
  void SendReadRequest(SendWqe& w, uint32_t from_pkt, OutBatch& out);

  RcRequesterState state_;
  // SendPass::payload's storage, kept from pass to pass (under the QP's lock): a ping-pong's every post allocated it.
  std::vector<std::span<const uint8_t>> pass_payload_;
};

}  // namespace uroce::emu
