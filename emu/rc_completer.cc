// The RC completer (rc_completer.h): classifies each response and tells the requester, which owns what it changes.
#include "emu/rc_completer.h"

#include <string>

#include "emu/device_core.h"
#include "emu/out_batch.h"
#include "emu/queue_pair.h"
#include "wire/frame.h"
#include "wire/headers.h"
#include "wire/opcode.h"

namespace uroce::emu {

std::string_view ToString(ResponseOutcome outcome) {
  switch (outcome) {
    case ResponseOutcome::kNeverSent: return "names a PSN never sent";
    case ResponseOutcome::kAck: return "ACK";
    case ResponseOutcome::kRnrNak: return "RNR NAK";
    case ResponseOutcome::kSequenceNak: return "sequence NAK";
    case ResponseOutcome::kFatalNak: return "NAK";
    case ResponseOutcome::kReservedSyndrome: return "reserved syndrome";
    case ResponseOutcome::kReadResponse: return "READ response";
    case ResponseOutcome::kAtomicAck: return "atomic ACK";
    case ResponseOutcome::kNotAResponse: return "not a response";
  }
  return "?";
}

// What a NAK's code makes of the WQE it names (IBTA 9.7.5.2.x, the completion statuses of ibv_poll_cq(3)).
WcStatus StatusOfNak(wire::NakCode code) {
  switch (code) {
    case wire::NakCode::kInvalidRequest: return WcStatus::kRemInvReqErr;
    case wire::NakCode::kRemoteAccessError: return WcStatus::kRemAccessErr;
    case wire::NakCode::kRemoteOperationalError: return WcStatus::kRemOpErr;
    case wire::NakCode::kInvalidRdRequest: return WcStatus::kRemInvRdReqErr;
    default: return WcStatus::kBadRespErr;
  }
}

void RcCompleter::OnResponse(const wire::PacketView& p, OutBatch& out) {
  const ResponseOutcome outcome = Classify(p);
  std::string_view fate;
  RcRequester& requester = qp_.requester();
  switch (outcome) {
    case ResponseOutcome::kNeverSent:
      // rxe's check_psn: a response for a PSN never sent changes nothing. An ACK with a PSN ahead of ours would
      // otherwise complete a WRITE its responder never received (a stopped peer, a forged packet).
      core_.Count(&DeviceCounters::rc_unexpected_responses);
      break;
    case ResponseOutcome::kAck: fate = requester.OnAck(p.bth.psn, out); break;
    case ResponseOutcome::kRnrNak: fate = requester.OnRnrNak(p.bth.psn, p.aeth->rnr_timer(), out); break;
    case ResponseOutcome::kSequenceNak: fate = requester.OnSequenceNak(p.bth.psn, out); break;
    case ResponseOutcome::kFatalNak:
      fate = requester.OnFatalNak(p.bth.psn, StatusOfNak(p.aeth->nak_code()), out);
      break;
    case ResponseOutcome::kReadResponse: fate = requester.OnReadResponse(p, out); break;
    case ResponseOutcome::kAtomicAck: fate = requester.OnAtomicAck(p, out); break;
    case ResponseOutcome::kReservedSyndrome:
    case ResponseOutcome::kNotAResponse:
      break;  // ignored
  }
  if (core_.tracing()) {
    std::string line = "completer qp " + Hex24(qp_.qpn()) + " psn " + Hex24(p.bth.psn) + " " +
                       std::string(p.info->name) + ": " + std::string(ToString(outcome));
    if (outcome == ResponseOutcome::kFatalNak || outcome == ResponseOutcome::kSequenceNak)
      line += " (" + std::string(wire::ToString(p.aeth->nak_code())) + ")";
    if (!fate.empty()) line += " -> " + std::string(fate);
    core_.Trace(line);
  }
}

ResponseOutcome RcCompleter::Classify(const wire::PacketView& p) const {
  // A response names a PSN this requester has sent (IBTA 9.7.5.2: the completer checks a response's PSN against
  // what is outstanding).
  if (!qp_.requester().HasSent(p.bth.psn)) return ResponseOutcome::kNeverSent;
  switch (p.info->op) {
    case wire::Operation::kReadResponse: return ResponseOutcome::kReadResponse;
    case wire::Operation::kAtomicAcknowledge: return ResponseOutcome::kAtomicAck;
    case wire::Operation::kAcknowledge: break;
    default: return ResponseOutcome::kNotAResponse;
  }
  if (!p.aeth) return ResponseOutcome::kNotAResponse;
  switch (p.aeth->kind()) {
    case wire::AethKind::kAck: return ResponseOutcome::kAck;
    case wire::AethKind::kRnrNak: return ResponseOutcome::kRnrNak;
    case wire::AethKind::kNak:
      return p.aeth->nak_code() == wire::NakCode::kPsnSeqError ? ResponseOutcome::kSequenceNak
                                                                 : ResponseOutcome::kFatalNak;
    default: return ResponseOutcome::kReservedSyndrome;
  }
}

}  // namespace uroce::emu
