// The Unreliable Connection transport of one QP (IBTA vol1 9.7.6.1 / 9.8): SEND and RDMA WRITE, with and without
// immediate, in PSN order without acknowledgements. The sender completes a WR once its packets are handed to the
// network; the receiver assembles a message while the PSNs follow each other and abandons it at a gap, resuming at the
// next FIRST or ONLY packet (9.7.6.1.3). Nothing is NAKed: what cannot be placed is dropped and counted.
//
// Every method runs with its QP's lock held (QueuePair::mutex(), device_core.h).
#pragma once

#include "emu/transport_object.h"
#include "emu/work_request.h"
#include "wire/packet.h"

namespace uroce::emu {

struct OutBatch;
struct DeviceCounters;

class UcTransport : private TransportObject {
 public:
  UcTransport(DeviceCore& core, QueuePair& qp) : TransportObject(core, qp) {}

  // EINVAL for an operation UC does not carry (IBTA table 39); errors found while gathering complete the WR with
  // an error status and move the send queue to SQE.
  // A send towards a peer that asked for a pause waits in the QP (DeviceCore::HoldUnreliableSend).
  int Post(SendWr& wr, OutBatch& out);
  // Sends (or executes) a posted WR: at once, or once the pause towards the QP's peer ended.
  void Send(const SendWr& wr, OutBatch& out);
  void Receive(const wire::PacketView& p);

 private:
  bool InSequence(const wire::PacketView& p, bool starts);
  bool StartMessage(const wire::PacketView& p, bool is_send);
  bool Place(const wire::PacketView& p);
  void CompleteMessage(const wire::PacketView& p);
  void ReleaseMessage();
  // Drops the message in progress (counted under `why`) until the next FIRST or ONLY packet.
  void DropMessage(uint64_t DeviceCounters::*why);
};

}  // namespace uroce::emu
