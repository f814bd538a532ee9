#include "emu/work_request.h"

namespace uroce::emu {

std::string_view ToString(SendOpcode op) {
  switch (op) {
    case SendOpcode::kRdmaWrite: return "RDMA_WRITE";
    case SendOpcode::kRdmaWriteWithImm: return "RDMA_WRITE_WITH_IMM";
    case SendOpcode::kSend: return "SEND";
    case SendOpcode::kSendWithImm: return "SEND_WITH_IMM";
    case SendOpcode::kRdmaRead: return "RDMA_READ";
    case SendOpcode::kAtomicCmpAndSwp: return "ATOMIC_CMP_AND_SWP";
    case SendOpcode::kAtomicFetchAndAdd: return "ATOMIC_FETCH_AND_ADD";
    case SendOpcode::kLocalInv: return "LOCAL_INV";
    case SendOpcode::kBindMw: return "BIND_MW";
    case SendOpcode::kSendWithInv: return "SEND_WITH_INV";
    case SendOpcode::kTso: return "TSO";
    case SendOpcode::kDriver1: return "DRIVER1";
    case SendOpcode::kAtomicWrite: return "ATOMIC_WRITE";
  }
  return "UNKNOWN";
}

std::string_view ToString(WcStatus s) {
  // The strings of ibv_wc_status_str(3).
  static constexpr std::string_view kNames[] = {
      "success", "local length error", "local QP operation error", "local EE context operation error",
      "local protection error", "Work Request Flushed Error", "memory bind operation error", "bad response error",
      "local access error", "remote invalid request error", "remote access error", "remote operation error",
      "transport retry counter exceeded", "RNR retry counter exceeded", "local RDD violation error",
      "remote invalid RD request", "operation aborted", "invalid EE context number", "invalid EE context state",
      "fatal error", "response timeout error", "general error"};
  const size_t i = static_cast<size_t>(s);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

}  // namespace uroce::emu
