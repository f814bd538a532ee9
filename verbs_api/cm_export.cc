// The connection manager's C table for librdmacm (cm_export.h): each entry calls the device's
// emu::ConnectionManager, with C++ exceptions stopped here (ENOMEM).
#include "verbs_api/cm_export.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>

#include "verbs_api/engine.h"
#include "verbs_api/internal.h"

namespace {

using uroce::emu::CmEvent;
using uroce::emu::ConnectionManager;
using uroce::verbs::NoThrow;
using uroce::wire::IpAddress;

ConnectionManager& Cm(uroce_cm* cm) { return *reinterpret_cast<ConnectionManager*>(cm); }
std::span<const uint8_t> Bytes(const uint8_t* data, uint32_t len) { return {data, data ? len : 0u}; }

// Hands the CM's events to librdmacm's C callback.
class CallbackSink final : public uroce::emu::CmEventSink {
 public:
  CallbackSink(uroce_cm_event_fn fn, void* context) : fn_(fn), context_(context) {}
  void OnCmEvent(const CmEvent& event) override { fn_(context_, &event); }

 private:
  uroce_cm_event_fn fn_;
  void* context_;
};

// The sink installed on each CM. Never destroyed: a progress thread may still deliver while the process exits.
std::mutex g_sinks_mu;
auto& g_sinks = *new std::map<ConnectionManager*, std::unique_ptr<CallbackSink>>;

uroce_cm* CmOf(ibv_context* context) {
  if (context == nullptr) return nullptr;
  return reinterpret_cast<uroce_cm*>(&uroce::verbs::Ctx(context)->dev().connection_manager());
}

int SetSink(uroce_cm* cm, uroce_cm_event_fn fn, void* sink_context) {
  return NoThrow(ENOMEM, [&] {
    std::lock_guard lock(g_sinks_mu);
    auto sink = fn ? std::make_unique<CallbackSink>(fn, sink_context) : nullptr;
    Cm(cm).SetSink(sink.get());  // returns once the previous sink is no longer called: it may go
    g_sinks[&Cm(cm)] = std::move(sink);
    return 0;
  });
}

// On the host device (the default; not UROCE_DEVICE=process) a listen is also a route: the service sends new connections for the service
// ID to this process (wire/service_protocol.h). The service IDs of this process's listens, by listen ID.
std::mutex g_routes_mu;
auto& g_routed_listens = *new std::map<uint32_t, uint64_t>;

uroce::verbs::HostDeviceMembership* Membership() {
  auto engine = uroce::verbs::Engine::Running();
  return engine ? engine->membership() : nullptr;  // the engine lives while a device is open: ours is
}

int Listen(uroce_cm* cm, uint64_t service_id, void* context, uint32_t* listen_id) {
  return NoThrow(ENOMEM, [&] {
    if (int err = Cm(cm).Listen(service_id, context, listen_id)) return err;
    if (auto* membership = Membership()) {
      if (int err = membership->Listen(service_id)) {
        Cm(cm).StopListening(*listen_id);
        return err;
      }
      std::lock_guard lock(g_routes_mu);
      g_routed_listens[*listen_id] = service_id;
    }
    return 0;
  });
}

int StopListening(uroce_cm* cm, uint32_t listen_id) {
  return NoThrow(ENOMEM, [&] {
    if (int err = Cm(cm).StopListening(listen_id)) return err;
    std::optional<uint64_t> routed;
    {
      std::lock_guard lock(g_routes_mu);
      if (auto it = g_routed_listens.find(listen_id); it != g_routed_listens.end()) {
        routed = it->second;
        g_routed_listens.erase(it);
      }
    }
    if (auto* membership = Membership(); membership && routed) membership->Unlisten(*routed);
    return 0;
  });
}

int SendRep(uroce_cm* cm, uint32_t id, const uroce::wire::CmRep* rep) {
  return NoThrow(ENOMEM, [&] { return Cm(cm).SendRep(id, *rep); });
}

int SendSidrRep(uroce_cm* cm, uint32_t id, const uroce::wire::CmSidrRep* rep) {
  return NoThrow(ENOMEM, [&] { return Cm(cm).SendSidrRep(id, *rep); });
}

int Drop(uroce_cm* cm, uint32_t id) {
  return NoThrow(ENOMEM, [&] { return Cm(cm).Drop(id); });
}

int SendReq(uroce_cm* cm, const uint8_t local[16], const uint8_t peer[16], const uroce::wire::CmReq* req,
            void* context, uint32_t* id) {
  return NoThrow(ENOMEM, [&] {
    return Cm(cm).SendReq(IpAddress::FromBytes(peer), *req, context, id, IpAddress::FromBytes(local));
  });
}

int SendRtu(uroce_cm* cm, uint32_t id, const uint8_t* private_data, uint32_t len) {
  return NoThrow(ENOMEM, [&] { return Cm(cm).SendRtu(id, Bytes(private_data, len)); });
}

int SendSidrReq(uroce_cm* cm, const uint8_t local[16], const uint8_t peer[16], const uroce::wire::CmSidrReq* req,
                void* context, uint32_t* id) {
  return NoThrow(ENOMEM, [&] {
    return Cm(cm).SendSidrReq(IpAddress::FromBytes(peer), *req, context, id, IpAddress::FromBytes(local));
  });
}

int SendRej(uroce_cm* cm, uint32_t id, uint16_t reason, const uint8_t* private_data, uint32_t len) {
  return NoThrow(ENOMEM, [&] { return Cm(cm).SendRej(id, reason, Bytes(private_data, len)); });
}

int SendDreq(uroce_cm* cm, uint32_t id) {
  return NoThrow(ENOMEM, [&] { return Cm(cm).SendDreq(id); });
}

int SendDrep(uroce_cm* cm, uint32_t id) {
  return NoThrow(ENOMEM, [&] { return Cm(cm).SendDrep(id); });
}

int Destroy(uroce_cm* cm, uint32_t id) {
  return NoThrow(ENOMEM, [&] { return Cm(cm).Destroy(id); });
}

void PeerGone(uroce_cm* cm, const uint8_t peer[16]) {
  NoThrow(0, [&] {
    Cm(cm).OnPeerGone(IpAddress::FromBytes(peer));
    return 0;
  });
}

constexpr uroce_cm_ops kOps = {
    .abi_version = UROCE_CM_ABI_VERSION,
    .size = sizeof(uroce_cm_ops),
    .layout = uroce::cm_abi::LayoutHere(),
    .cm_of = CmOf,
    .set_sink = SetSink,
    .listen = Listen,
    .stop_listening = StopListening,
    .send_rep = SendRep,
    .send_sidr_rep = SendSidrRep,
    .drop = Drop,
    .send_req = SendReq,
    .send_rtu = SendRtu,
    .send_sidr_req = SendSidrReq,
    .send_rej = SendRej,
    .send_dreq = SendDreq,
    .send_drep = SendDrep,
    .destroy = Destroy,
    .peer_gone = PeerGone,
};

}  // namespace

extern "C" const uroce_cm_ops* uroce_get_cm_ops(uint32_t wanted_version) {
  if (wanted_version != UROCE_CM_ABI_VERSION) {
    errno = EPROTO;
    return nullptr;
  }
  return &kOps;
}

// What librdmacm.so.1 of the builds before the table called: it got the ConnectionManager and called its C++
// vtable. Kept (in UROCE_PRIVATE_1) only to refuse such a librdmacm with a message instead of a missing symbol;
// it then fails as with no device (ENODEV).
extern "C" void* uroce_connection_manager(ibv_context*) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    std::fprintf(stderr,
                 "uroce: libibverbs.so.1 (CM ABI %u) was loaded with a librdmacm.so.1 of an older uroce build, which "
                 "it refuses: use the two libraries of one build\n",
                 UROCE_CM_ABI_VERSION);
  }
  errno = ENODEV;
  return nullptr;
}
