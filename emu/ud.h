// The Unreliable Datagram transport of one QP (IBTA vol1 9.8, 10.2.4): one-packet SENDs to the QP an address handle
// and remote QPN name, checked by Q_Key at the receiver, which places the sender's IP header in the 40-byte GRH slot
// of the receive buffer (RoCEv2 A17.4.5.1). No connection, no acknowledgement, no RNR: a datagram without a receive
// WQE is lost.
//
// Every method runs with its QP's lock held (QueuePair::mutex(), device_core.h).
#pragma once

#include "emu/transport_object.h"
#include "emu/work_request.h"
#include "wire/packet.h"
#include "wire/transport.h"

namespace uroce::emu {

struct OutBatch;

class UdTransport : private TransportObject {
 public:
  UdTransport(DeviceCore& core, QueuePair& qp) : TransportObject(core, qp) {}

  // EINVAL for an operation UD does not carry or an AH of another PD; a message above the MTU or a refused SGE
  // completes the WR with an error status and moves the send queue to SQE.
  // A send towards a peer that asked for a pause waits in the QP (DeviceCore::HoldUnreliableSend).
  int Post(SendWr& wr, OutBatch& out);
  // Sends a posted WR (at once, or once the pause towards `peer`, its AH's destination, ended).
  void Send(const SendWr& wr, const wire::IpAddress& peer, OutBatch& out);
  // A datagram for this QP (or a multicast group it joined) from `d`.
  void Receive(const wire::InDatagram& d, const wire::PacketView& p);
};

}  // namespace uroce::emu
