// librdmacm's side of verbs_api/cm_export.h: the engine's connection manager (emu/connection_manager.h), reached
// through the C table libibverbs.so.1 exports, after a check that the table is the one this library was built for.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <span>

#include "verbs_api/cm_export.h"
#include "wire/address.h"
#include "wire/cm_mad.h"

namespace uroce::rdmacm {

// How the table is found: uroce_get_cm_ops of the libibverbs.so.1 loaded (weak: NULL when that library has none).
using CmOpsLookup = const uroce_cm_ops* (*)(uint32_t wanted_version);
CmOpsLookup DefaultCmOpsLookup();

// The table of UROCE_CM_ABI_VERSION from `lookup`, or nullptr with errno EPROTO after one line on stderr saying what
// does not match ("uroce: librdmacm.so.1 was built for ..."; not when `quiet`).
const uroce_cm_ops* CheckedCmOps(CmOpsLookup lookup, bool quiet = false);

// One device's CM, through the table. Every call returns 0 or a positive errno.
class EngineCm {
 public:
  // Takes the CM of `context` from `ops` (a checked table). 0 or ENODEV.
  int Open(const uroce_cm_ops* ops, ibv_context* context);

  int SetSink(uroce_cm_event_fn fn, void* sink_context) { return ops_->set_sink(cm_, fn, sink_context); }
  int Listen(uint64_t service_id, void* context, uint32_t* listen_id) {
    return ops_->listen(cm_, service_id, context, listen_id);
  }
  int StopListening(uint32_t listen_id) { return ops_->stop_listening(cm_, listen_id); }
  int SendRep(uint32_t id, const wire::CmRep& rep) { return ops_->send_rep(cm_, id, &rep); }
  int SendSidrRep(uint32_t id, const wire::CmSidrRep& rep) { return ops_->send_sidr_rep(cm_, id, &rep); }
  int Drop(uint32_t id) { return ops_->drop(cm_, id); }
  // From our address `local` (unspecified: GID 0's).
  int SendReq(const wire::IpAddress& local, const wire::IpAddress& peer, const wire::CmReq& req, void* context,
              uint32_t* id) {
    return ops_->send_req(cm_, local.bytes().data(), peer.bytes().data(), &req, context, id);
  }
  int SendRtu(uint32_t id, std::span<const uint8_t> private_data) {
    return ops_->send_rtu(cm_, id, private_data.data(), uint32_t(private_data.size()));
  }
  int SendSidrReq(const wire::IpAddress& local, const wire::IpAddress& peer, const wire::CmSidrReq& req,
                  void* context, uint32_t* id) {
    return ops_->send_sidr_req(cm_, local.bytes().data(), peer.bytes().data(), &req, context, id);
  }
  int SendRej(uint32_t id, uint16_t reason, std::span<const uint8_t> private_data) {
    return ops_->send_rej(cm_, id, reason, private_data.data(), uint32_t(private_data.size()));
  }
  int SendDreq(uint32_t id) { return ops_->send_dreq(cm_, id); }
  int SendDrep(uint32_t id) { return ops_->send_drep(cm_, id); }
  // Waits for a delivery in progress for `id`: never with a lock the sink takes (Lib::mu).
  int Destroy(uint32_t id) { return ops_->destroy(cm_, id); }
  void OnPeerGone(const wire::IpAddress& peer) { ops_->peer_gone(cm_, peer.bytes().data()); }

 private:
  const uroce_cm_ops* ops_ = nullptr;
  uroce_cm* cm_ = nullptr;
};

}  // namespace uroce::rdmacm
