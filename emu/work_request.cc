#include "emu/work_request.h"

#include <array>

namespace uroce::emu {

namespace {

constexpr uint8_t kRc = QpTypeBit(QpType::kRc), kUc = QpTypeBit(QpType::kUc), kUd = QpTypeBit(QpType::kUd),
                  kXrc = QpTypeBit(QpType::kXrcSend);
using K = SendOpcodeInfo::Kind;

// IBTA table 38 says which operations each service carries: UD sends only, UC no READ or atomics; memory windows
// and invalidation (10.6.7) need a connected QP; SEND with invalidate is RC/XRC only (rxe's table agrees).
constexpr SendOpcodeInfo kSendOpcodes[] = {
    {SendOpcode::kRdmaWrite, "RDMA_WRITE", kRc | kUc | kXrc, K::kWrite, false, false, true, true, WcOpcode::kRdmaWrite},
    {SendOpcode::kRdmaWriteWithImm, "RDMA_WRITE_WITH_IMM", kRc | kUc | kXrc, K::kWrite, true, false, true, true,
     WcOpcode::kRdmaWrite},
    {SendOpcode::kSend, "SEND", kRc | kUc | kUd | kXrc, K::kSend, false, false, true, true, WcOpcode::kSend},
    {SendOpcode::kSendWithImm, "SEND_WITH_IMM", kRc | kUc | kUd | kXrc, K::kSend, true, false, true, true,
     WcOpcode::kSend},
    {SendOpcode::kRdmaRead, "RDMA_READ", kRc | kXrc, K::kRead, false, false, true, false, WcOpcode::kRdmaRead},
    {SendOpcode::kAtomicCmpAndSwp, "ATOMIC_CMP_AND_SWP", kRc | kXrc, K::kAtomic, false, false, true, false,
     WcOpcode::kCompSwap},
    {SendOpcode::kAtomicFetchAndAdd, "ATOMIC_FETCH_AND_ADD", kRc | kXrc, K::kAtomic, false, false, true, false,
     WcOpcode::kFetchAdd},
    {SendOpcode::kLocalInv, "LOCAL_INV", kRc | kUc | kXrc, K::kLocal, false, false, false, false,
     WcOpcode::kLocalInv},
    {SendOpcode::kBindMw, "BIND_MW", kRc | kUc | kXrc, K::kLocal, false, false, false, false, WcOpcode::kBindMw},
    {SendOpcode::kSendWithInv, "SEND_WITH_INV", kRc | kXrc, K::kSend, false, true, true, true, WcOpcode::kSend},
};

// Indexed by the opcode's value (ibv_wr_opcode: 0..15).
constexpr auto kByValue = [] {
  std::array<const SendOpcodeInfo*, 16> t{};
  for (const SendOpcodeInfo& info : kSendOpcodes) t[static_cast<size_t>(info.opcode)] = &info;
  return t;
}();

}  // namespace

const SendOpcodeInfo* FindSendOpcode(SendOpcode op) {
  const size_t i = static_cast<size_t>(op);
  return i < kByValue.size() ? kByValue[i] : nullptr;
}

std::string_view ToString(SendOpcode op) {
  if (const SendOpcodeInfo* info = FindSendOpcode(op)) return info->name;
  switch (op) {
    case SendOpcode::kTso: return "TSO";
    case SendOpcode::kDriver1: return "DRIVER1";
    case SendOpcode::kAtomicWrite: return "ATOMIC_WRITE";
    default: return "UNKNOWN";
  }
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
