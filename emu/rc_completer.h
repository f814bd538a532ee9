// The RC completer of one QP (IBTA vol1 9.7.5.1-9.7.5.2): classifies each response -- one for a PSN never sent, an
// ACK, an RNR NAK, a sequence NAK, a NAK that ends the connection, a READ response, an atomic ACK -- and tells its
// QP's requester (RcRequester::OnAck, OnRnrNak, ...), which owns the send queue, the retry budgets and the timers
// and decides what the response completes or resends.
//
// Every method runs with its QP's lock held (QueuePair::mutex(), device_core.h).
#pragma once

#include <string_view>

#include "emu/transport_object.h"
#include "emu/work_request.h"
#include "wire/headers.h"
#include "wire/packet.h"

namespace uroce::emu {

struct OutBatch;

// What a response is to the completer (named in the decision trace).
enum class ResponseOutcome : uint8_t {
  kNeverSent,         // names a PSN the requester has not sent: changes nothing (counted)
  kAck,
  kRnrNak,
  kSequenceNak,
  kFatalNak,          // invalid request, remote access or operational error, invalid RD request
  kReservedSyndrome,  // an AETH syndrome IBTA reserves: ignored
  kReadResponse,
  kAtomicAck,
  kNotAResponse,      // an acknowledge without an AETH, or a request opcode: ignored
};
std::string_view ToString(ResponseOutcome outcome);

// The completion status a NAK's code gives the WQE it names.
WcStatus StatusOfNak(wire::NakCode code);

class RcCompleter : private TransportObject {
 public:
  RcCompleter(DeviceCore& core, QueuePair& qp) : TransportObject(core, qp) {}

  // A response for this QP's requester (the device checked transport, peer, state and P_Key).
  void OnResponse(const wire::PacketView& p, OutBatch& out);

 private:
  ResponseOutcome Classify(const wire::PacketView& p) const;
};

}  // namespace uroce::emu
