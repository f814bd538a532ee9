// The ibv_*_str helpers (ibv_devinfo prints with them). Texts follow rdma-core's, which scripts grep for.
#include <infiniband/verbs.h>

#include <cstdio>

#include "emu/work_request.h"

extern "C" {

const char* ibv_node_type_str(enum ibv_node_type t) {
  switch (t) {
    case IBV_NODE_CA: return "InfiniBand channel adapter";
    case IBV_NODE_SWITCH: return "InfiniBand switch";
    case IBV_NODE_ROUTER: return "InfiniBand router";
    case IBV_NODE_RNIC: return "iWARP NIC";
    case IBV_NODE_USNIC: return "usNIC";
    case IBV_NODE_USNIC_UDP: return "usNIC UDP";
    case IBV_NODE_UNSPECIFIED: return "unspecified";
    default: return "unknown";
  }
}

const char* ibv_port_state_str(enum ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP: return "PORT_NOP";
    case IBV_PORT_DOWN: return "PORT_DOWN";
    case IBV_PORT_INIT: return "PORT_INIT";
    case IBV_PORT_ARMED: return "PORT_ARMED";
    case IBV_PORT_ACTIVE: return "PORT_ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "PORT_ACTIVE_DEFER";
    default: return "invalid state";
  }
}

const char* ibv_event_type_str(enum ibv_event_type e) {
  static const char* const kNames[] = {
      "CQ error", "local work queue catastrophic error", "invalid request local work queue error",
      "local access violation work queue error", "communication established", "send queue drained",
      "path migrated", "path migration request error", "local catastrophic error", "port active", "port error",
      "LID change", "P_Key change", "SM change", "SRQ catastrophic error", "SRQ limit reached",
      "last WQE reached", "client reregistration", "GID table change", "WQ fatal"};
  const unsigned i = static_cast<unsigned>(e);
  return i < sizeof kNames / sizeof kNames[0] ? kNames[i] : "unknown";
}

const char* ibv_wc_status_str(enum ibv_wc_status status) {
  static thread_local char buf[64];
  const auto s = uroce::emu::ToString(static_cast<uroce::emu::WcStatus>(status));
  snprintf(buf, sizeof buf, "%.*s", static_cast<int>(s.size()), s.data());
  return buf;
}

}  // extern "C"
