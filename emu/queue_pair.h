// A queue pair: its attributes and state (qp_state_machine decides what may change), its receive queue, and its
// transport objects -- for RC (and XRC) a requester, a completer and a responder (rc_requester.h, rc_completer.h,
// rc_responder.h), for UC and UD one object each (uc.h, ud.h) -- which the Device hands work requests and packets.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>

#include "emu/completion_queue.h"
#include "emu/memory.h"
#include "emu/rc_completer.h"
#include "emu/rc_requester.h"
#include "emu/rc_responder.h"
#include "emu/rc_state.h"
#include "emu/srq.h"
#include "emu/types.h"
#include "emu/uc.h"
#include "emu/ud.h"
#include "emu/work_request.h"
#include "wire/address.h"
#include "wire/frame.h"
#include "wire/packet.h"

namespace uroce::emu {

class AddressHandle {
 public:
  AddressHandle(const ProtectionDomain* pd, const AddressVector& av) : pd_(pd), av_(av) {}
  const ProtectionDomain* pd() const { return pd_; }
  const AddressVector& av() const { return av_; }
  wire::IpAddress destination() const { return wire::IpAddress::FromBytes(av_.dgid.data()); }

 private:
  const ProtectionDomain* pd_;
  AddressVector av_;
};

struct QpInitAttributes {
  QpType type = QpType::kRc;
  ProtectionDomain* pd = nullptr;
  CompletionQueue* send_cq = nullptr;
  CompletionQueue* recv_cq = nullptr;
  QpCapabilities cap;
  bool sq_sig_all = false;
  // RC/UD: receive WQEs come from this SRQ instead of the QP's own receive queue (ibv_create_qp(3) NOTES).
  SharedReceiveQueue* srq = nullptr;
  // XRC_RECV: the domain whose SRQs the target may deliver into (Annex A14); it has no PD, CQs or queues of its own.
  XrcDomain* xrcd = nullptr;
};

// Receiver-side state of the message being assembled (UC and RC responder; IBTA 9.7.6 / 9.7.7).
struct InboundMessage {
  enum class Kind : uint8_t { kNone, kSend, kWrite } kind = Kind::kNone;
  std::optional<RecvWr> rqe;  // SEND: the receive WQE being filled
  // XRC target: the WQE is one of another process's SRQ of this number (rqe holds its place, empty): the one claimed,
  // of that length, which that process takes when it is handed the message's pieces (wire::SharedXrc).
  uint32_t relay_srqn = 0;
  uint64_t relay_index = 0;
  uint32_t relay_length = 0;
  uint64_t offset = 0;        // bytes placed so far
  // RDMA WRITE: the target the RETH named. Every packet checks its own part again (DeviceCore::WriteInbound): the MR
  // may be deregistered, or its window invalidated, while the message is arriving.
  uint64_t write_va = 0;
  uint32_t write_rkey = 0;
  uint64_t write_length = 0;
  bool dropping = false;  // UC: discard until the next FIRST/ONLY (9.7.6.1.3)
};

// A UC/UD send waiting for the pause towards its peer to end (DeviceCore::HoldUnreliableSend): the WR and where it
// goes (a UD WR's address handle may be destroyed meanwhile).
struct HeldSend {
  SendWr wr;
  wire::IpAddress peer;
};

// The window of an RC QP's receive queue that other processes of the host see for direct SENDs into it
// (DeviceConfig::direct, DeviceCore::PublishReceives, wire/direct_access.h). Counts run from the window's opening
// (the QP's first RTR since RESET); WQE number `packets_taken + direct_taken` is the queue's front.
struct DirectReceives {
  bool open = false;
  uint32_t epoch = 0;
  uint64_t packets_taken = 0;  // WQEs taken by messages that came as packets
  uint64_t direct_taken = 0;   // and by direct SENDs
  uint64_t published = 0;      // WQEs whose length the window shows
  // In the error state, the receive queue's flush waits until the direct SENDs counted into the window before it
  // (their initiators saw them succeed) have taken their WQEs: up to this count.
  bool flush_waiting = false;
  uint64_t flush_after = 0;
  // Records counted but never read (a peer that counted without writing, a ring found malformed) do not hold the
  // flush past this time (DeviceCore::kDirectFlushWaitNs): Device::RunTimers flushes then.
  uint64_t flush_deadline_ns = 0;
};

class QueuePair {
 public:
  QueuePair(DeviceCore& core, uint32_t qpn, const QpInitAttributes& init)
      : qpn_(qpn),
        init_(init),
        requester_(core, *this),
        completer_(core, *this),
        responder_(core, *this),
        uc_(core, *this),
        ud_(core, *this) {
    attrs_.cap = init.cap;
  }
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  // Held while anything of the QP changes or is read on the data path: its attributes, queues and transport objects
  // (device_core.h has the lock order). Taken only with the Device's object lock held, at least shared.
  std::mutex& mutex() const { return mu_; }

  uint32_t qpn() const { return qpn_; }
  QpType type() const { return init_.type; }
  QpState state() const { return attrs_.qp_state; }
  const QpInitAttributes& init() const { return init_; }
  const QpAttributes& attributes() const { return attrs_; }
  QpAttributes& mutable_attributes() { return attrs_; }

  std::deque<RecvWr>& receive_queue() { return rq_; }
  std::deque<HeldSend>& held_sends() { return held_sends_; }
  InboundMessage& inbound() { return inbound_; }
  DirectReceives& direct_receives() { return direct_receives_; }
  // A QP on an SRQ: the WQEs it took from the SRQ whose receive completions may still be in its CQ (at most as many
  // as the CQ holds), oldest first. When the QP is reset or destroyed with those completions unpolled, the CQ drops
  // them and the WQEs go back to the SRQ (DeviceCore::KeepSrqWqe, Device::CleanCqsLocked).
  std::deque<RecvWr>& srq_completed() { return srq_completed_; }
  RcRequester& requester() { return requester_; }
  RcCompleter& completer() { return completer_; }
  RcResponder& responder() { return responder_; }
  UcTransport& uc() { return uc_; }
  UdTransport& ud() { return ud_; }

  // A connected QP's peer: its primary path's DGID, at the RoCEv2 port.
  wire::UdpEndpoint peer() const {
    return {wire::IpAddress::FromBytes(attrs_.ah_attr.dgid.data()), wire::kRoceV2UdpPort};
  }
  // The UDP source port of its packets: the flow hash of both QPNs (RoCEv2 A17.5).
  uint16_t source_port() const { return wire::RoceSourcePort(qpn_, attrs_.dest_qp_num); }

  // Opaque back-pointer for the layer above (verbs_api's ibv_qp), so an async event finds its owner.
  void* owner = nullptr;
  // XRC_RECV: handles on the QP (its creation and each ibv_open_qp); destroyed with the last (ibv_open_qp(3)).
  int references = 1;
  // XRC_RECV: a handle on another process's target QP of the host (Device::OpenQp): no protocol runs here, its
  // attributes are what that process publishes; and whether that process is gone (the QP with it).
  bool runs_elsewhere = false;
  bool gone_elsewhere = false;
  // XRC_RECV taken over from a gone process whose last state was published pending (SharedTargetState): the piece
  // at `resend_psn`, which it may have handed already, goes again marked resent (wire::XrcDelivery).
  bool resend_pending = false;
  uint32_t resend_psn = 0;
  // XRC_RECV: the PD and receive CQ borrowed from the SRQ named by the request being processed, and that SRQ.
  SharedReceiveQueue* packet_srq = nullptr;
  // ... or, when that SRQ is another process's of the host (wire::SharedXrc), its number.
  uint32_t packet_remote_srqn = 0;
  QpInitAttributes& mutable_init() { return init_; }

  uint32_t NextSendPsn() {
    const uint32_t psn = attrs_.sq_psn;
    attrs_.sq_psn = (psn + 1) & 0xffffff;
    return psn;
  }

 private:
  mutable std::mutex mu_;
  const uint32_t qpn_;
  QpInitAttributes init_;
  QpAttributes attrs_;
  std::deque<RecvWr> rq_;
  std::deque<HeldSend> held_sends_;
  InboundMessage inbound_;
  DirectReceives direct_receives_;
  std::deque<RecvWr> srq_completed_;
  RcRequester requester_;
  RcCompleter completer_;
  RcResponder responder_;
  UcTransport uc_;
  UdTransport ud_;
};

// RC opcode -> the same operation on the QP's transport (XRC QPs use 0xA0 | the RC low 5 bits, Annex A14); an XRC
// initiator's requests (`wr` given) also carry the XRCETH naming the target SRQ. Defined in xrc.cc.
void ToQpTransport(const QueuePair& qp, const SendWr* wr, wire::PacketSpec& spec);

}  // namespace uroce::emu
