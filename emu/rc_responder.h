// The RC responder of one QP (IBTA vol1 9.7.5): checks each request's PSN (a gap: one sequence NAK; a duplicate: SEND
// and WRITE acknowledged again, READ and atomics answered again from saved state, never executed twice), then
// executes, NAKs or RNR-NAKs it, and acknowledges, at once or held (AckTiming). An XRC target is this responder, run
// with the PD, CQ and WQEs of the SRQ each request names (Device::ReceiveXrcTargetLocked).
//
// Every method runs with its QP's lock held (QueuePair::mutex(), device_core.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "emu/rc_state.h"
#include "emu/transport_object.h"
#include "wire/headers.h"
#include "wire/packet.h"

namespace uroce::emu {

struct OutBatch;

// How the responder's steps ended a request (RcResponder::kSteps; ToString names each for the decision trace).
// kPass: the step found nothing and the next one judges.
enum class RequestOutcome : uint8_t {
  kPass,
  kExecuted,             // carried out; READ and atomics answered, SEND/WRITE acknowledged as the packet asked
  kDuplicate,            // an earlier PSN: answered again from saved state, never executed twice (9.7.5.1.3)
  kSequenceGap,          // a later PSN: packets were lost, one sequence NAK per gap (9.7.5.1.1)
  kInvalidOpcode,        // not an RC request
  kOutOfSequenceOpcode,  // FIRST/ONLY inside a message, MIDDLE/LAST outside one, READ/atomic inside one (9.7.5.1.2)
  kReceiverNotReady,     // no receive WQE: RNR NAK (9.7.5.2.8)
  kLengthError,          // not PMTU-sized for its place, or not the RETH's length
  kAccessDenied,         // key, range, rights, or memory gone (9.7.5.2.5)
  kMisalignedAtomic,     // an atomic's address is not 8-byte aligned (9.4.5)
  kReceiveTooSmall,      // a SEND longer than its receive WQE (the receive completes with LOC_LEN_ERR)
  kReceiveUnusable,      // the receive WQE's buffers cannot be written (remote operational error)
  kInvalidateRefused,    // SEND with invalidate of an R_Key this QP may not invalidate (9.4.6)
};
std::string_view ToString(RequestOutcome outcome);

class RcResponder : private TransportObject {
 public:
  // How long the ACK of a one-packet message may wait for a reply to take it along (AckTiming::kHeld).
  static constexpr uint64_t kAckHoldNs = 20'000;
  // How long the ACK of a longer message, or of a QP whose ACKs are already held, may wait: a stream's requester
  // must see its window move (ib_write_bw 64 KiB lost a third of its rate with 20 us here).
  static constexpr uint64_t kAckCoalesceNs = 3'000;

  RcResponder(DeviceCore& core, QueuePair& qp) : TransportObject(core, qp) {}

  RcResponderState& state() { return state_; }
  const RcResponderState& state() const { return state_; }
  void Reset();  // RESET: a fresh responder (a held ACK is dropped)

  // A request for this QP (the device checked transport, peer, state and P_Key).
  void OnRequest(const wire::PacketView& p, OutBatch& out);
  // Sends an ACK or NAK now; it covers an ACK the QP holds, which is dropped.
  void SendAck(uint32_t psn, const wire::Aeth& aeth, OutBatch& out);
  // Refuses the request at the expected PSN with a NAK that ends the connection: the QP enters the error state
  // (IBTA 9.7.5.2.x: invalid request, remote access and remote operational errors).
  void FatalNak(wire::NakCode code, OutBatch& out);
  // The same naming `psn`: a READ whose response `psn` cannot be built (the expected PSN is already past the READ).
  void FatalNakAt(uint32_t psn, wire::NakCode code, OutBatch& out);
  bool ack_held() const { return state_.ack_held; }
  uint64_t held_due_ns() const { return state_.held_due_ns; }
  // Sends the ACK it holds, if any (drops it in the error state).
  void SendHeldAck(OutBatch& out);

 private:
  struct Request;
  // One step of a request's way (kSteps): kPass, or the outcome that ends it.
  struct Step {
    std::string_view name;
    RequestOutcome (RcResponder::*run)(Request& q, OutBatch& out);
  };
  static const Step kSteps[];

  RequestOutcome CheckPsn(Request& q, OutBatch& out);
  RequestOutcome CheckOpcode(Request& q, OutBatch& out);
  RequestOutcome CheckSequence(Request& q, OutBatch& out);
  RequestOutcome CheckResources(Request& q, OutBatch& out);
  RequestOutcome CheckLength(Request& q, OutBatch& out);
  RequestOutcome CheckKey(Request& q, OutBatch& out);
  RequestOutcome Execute(Request& q, OutBatch& out);
  RequestOutcome AcknowledgeRequest(Request& q, OutBatch& out);
  // What Execute does per operation.
  RequestOutcome ExecuteMessagePacket(Request& q);
  RequestOutcome PlaceSend(const Request& q);
  RequestOutcome HandSend(const Request& q);
  RequestOutcome PlaceWrite(const Request& q);
  void CompleteMessage(const Request& q);
  RequestOutcome ExecuteRead(Request& q, OutBatch& out);
  RequestOutcome ExecuteAtomic(Request& q, OutBatch& out);
  void SaveResource(const ResponderResource& res);
  void AnswerDuplicate(const Request& q, OutBatch& out);
  // Counts the outcome and sends what it calls for (an RNR NAK, a NAK that ends the connection).
  void Conclude(const Request& q, RequestOutcome outcome, OutBatch& out);
  void TraceRequest(const Request& q, RequestOutcome outcome, const std::string& steps) const;

  // The ACK for requests up to `psn`, of a message of one packet or not: sent now or held, as the batch's ack_timing
  // says.
  void Acknowledge(uint32_t psn, bool one_packet, OutBatch& out);
  // It holds no ACK any more (sent, covered, or not to be sent).
  void DropHeldAck();
  void SendReadResponses(const ResponderResource& r, uint32_t from_psn, OutBatch& out);
  // The atomic ACK of the request at `psn`: the original value, under the MSN after it (new or saved, 9.7.5.1.6).
  void SendAtomicAck(uint32_t psn, uint32_t msn, uint64_t original, OutBatch& out);

  RcResponderState state_;
};

}  // namespace uroce::emu
