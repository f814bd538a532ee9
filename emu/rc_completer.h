// The RC completer of one QP (IBTA vol1 9.7.5.1-9.7.5.2): consumes ACKs, NAKs, RNR NAKs, READ responses and atomic
// ACKs, marks the requester's WQEs done and has them completed strictly in order; a NAK or a gap in READ responses
// sends the requester back. It works on its QP's requester (rc_requester.h), as rxe's completer works on the
// requester's queue.
//
// Every method runs with its QP's lock held (QueuePair::mutex(), device_core.h).
#pragma once

#include "emu/transport_object.h"
#include "wire/packet.h"

namespace uroce::emu {

struct OutBatch;

class RcCompleter : private TransportObject {
 public:
  RcCompleter(DeviceCore& core, QueuePair& qp) : TransportObject(core, qp) {}

  // A response for this QP's requester (the device checked transport, peer, state and P_Key).
  void OnResponse(const wire::PacketView& p, OutBatch& out);
};

}  // namespace uroce::emu
