// A queue pair: its attributes and state (qp_state_machine decides what may change), its send and receive queues,
// and the per-transport protocol state used by the requester (work requests out) and responder (packets in).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>

#include "emu/completion_queue.h"
#include "emu/memory.h"
#include "emu/rc_state.h"
#include "emu/srq.h"
#include "emu/types.h"
#include "emu/work_request.h"
#include "wire/address.h"

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
  uint64_t offset = 0;        // bytes placed so far
  // RDMA WRITE: the target the RETH named. Every packet checks its own part again (WriteTargetLocked): the MR may be
  // deregistered, or its window invalidated, while the message is arriving.
  uint64_t write_va = 0;
  uint32_t write_rkey = 0;
  uint64_t write_length = 0;
  bool dropping = false;  // UC: discard until the next FIRST/ONLY (9.7.6.1.3)
};

class QueuePair {
 public:
  QueuePair(uint32_t qpn, const QpInitAttributes& init) : qpn_(qpn), init_(init) {
    attrs_.cap = init.cap;
  }

  uint32_t qpn() const { return qpn_; }
  QpType type() const { return init_.type; }
  QpState state() const { return attrs_.qp_state; }
  const QpInitAttributes& init() const { return init_; }
  const QpAttributes& attributes() const { return attrs_; }
  QpAttributes& mutable_attributes() { return attrs_; }

  std::deque<RecvWr>& receive_queue() { return rq_; }
  InboundMessage& inbound() { return inbound_; }
  RcRequester& requester() { return requester_; }
  RcResponder& responder() { return responder_; }

  // Opaque back-pointer for the layer above (verbs_api's ibv_qp), so an async event finds its owner.
  void* owner = nullptr;
  // XRC_RECV: handles on the QP (its creation and each ibv_open_qp); destroyed with the last (ibv_open_qp(3)).
  int references = 1;
  // XRC_RECV: the PD and receive CQ borrowed from the SRQ named by the request being processed, and that SRQ.
  SharedReceiveQueue* packet_srq = nullptr;
  QpInitAttributes& mutable_init() { return init_; }

  uint32_t NextSendPsn() {
    const uint32_t psn = attrs_.sq_psn;
    attrs_.sq_psn = (psn + 1) & 0xffffff;
    return psn;
  }

 private:
  const uint32_t qpn_;
  QpInitAttributes init_;
  QpAttributes attrs_;
  std::deque<RecvWr> rq_;
  InboundMessage inbound_;
  RcRequester requester_;
  RcResponder responder_;
};

}  // namespace uroce::emu
