// Work requests and completions as the emulated HCA holds them. Values equal those of the verbs API (ibv_wr_opcode,
// ibv_send_flags, ibv_wc_status, ibv_wc_opcode, ibv_wc_flags) so verbs_api converts by value (pinned there).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "emu/types.h"

namespace uroce::emu {

class AddressHandle;

enum class SendOpcode : uint8_t {
  kRdmaWrite = 0,
  kRdmaWriteWithImm = 1,
  kSend = 2,
  kSendWithImm = 3,
  kRdmaRead = 4,
  kAtomicCmpAndSwp = 5,
  kAtomicFetchAndAdd = 6,
  kLocalInv = 7,
  kBindMw = 8,
  kSendWithInv = 9,
  kTso = 10,
  kDriver1 = 11,
  kAtomicWrite = 15,
};
std::string_view ToString(SendOpcode op);

namespace send_flags {
inline constexpr uint32_t kFence = 1u << 0;
inline constexpr uint32_t kSignaled = 1u << 1;
inline constexpr uint32_t kSolicited = 1u << 2;
inline constexpr uint32_t kInline = 1u << 3;
inline constexpr uint32_t kIpCsum = 1u << 4;
}  // namespace send_flags

struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

struct SendWr {
  uint64_t wr_id = 0;
  SendOpcode opcode = SendOpcode::kSend;
  uint32_t flags = 0;
  std::vector<Sge> sg_list;
  std::vector<uint8_t> inline_data;  // IBV_SEND_INLINE: copied at post time, sg_list then empty
  uint32_t imm_data = 0;             // network byte order as in ibv_send_wr (wire bytes)
  uint32_t invalidate_rkey = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  // UD
  const AddressHandle* ah = nullptr;
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;
  // XRC
  uint32_t remote_srqn = 0;
  // BIND_MW (a type 1 bind from ibv_bind_mw, or a type 2 bind work request): window, its next R_Key, what it opens.
  struct Bind {
    uint32_t mw_rkey = 0;
    uint32_t new_rkey = 0;
    uint32_t mr_lkey = 0;
    uint64_t addr = 0;
    uint64_t length = 0;
    uint32_t access = 0;
  } bind;

  uint64_t TotalLength() const;
};

struct RecvWr {
  uint64_t wr_id = 0;
  std::vector<Sge> sg_list;
  uint64_t TotalLength() const;
};

enum class WcStatus : uint8_t {
  kSuccess = 0,
  kLocLenErr = 1,
  kLocQpOpErr = 2,
  kLocEecOpErr = 3,
  kLocProtErr = 4,
  kWrFlushErr = 5,
  kMwBindErr = 6,
  kBadRespErr = 7,
  kLocAccessErr = 8,
  kRemInvReqErr = 9,
  kRemAccessErr = 10,
  kRemOpErr = 11,
  kRetryExcErr = 12,
  kRnrRetryExcErr = 13,
  kLocRddViolErr = 14,
  kRemInvRdReqErr = 15,
  kRemAbortErr = 16,
  kInvEecnErr = 17,
  kInvEecStateErr = 18,
  kFatalErr = 19,
  kRespTimeoutErr = 20,
  kGeneralErr = 21,
};
std::string_view ToString(WcStatus s);

enum class WcOpcode : uint8_t {
  kSend = 0,
  kRdmaWrite = 1,
  kRdmaRead = 2,
  kCompSwap = 3,
  kFetchAdd = 4,
  kBindMw = 5,
  kLocalInv = 6,
  kTso = 7,
  kAtomicWrite = 9,
  kRecv = 128,
  kRecvRdmaWithImm = 129,
};

namespace wc_flags {
inline constexpr uint32_t kGrh = 1u << 0;
inline constexpr uint32_t kWithImm = 1u << 1;
inline constexpr uint32_t kIpCsumOk = 1u << 2;
inline constexpr uint32_t kWithInv = 1u << 3;
}  // namespace wc_flags

// One completion queue entry (the union of ibv_wc and what ibv_cq_ex can read).
// What each send work-request opcode is, once (rxe's rxe_wr_opcode_info; ibv_post_send(3), ibv_wr_post(3), IBTA
// table 38): every place that must know what an opcode needs or allows asks here.
struct SendOpcodeInfo {
  SendOpcode opcode;
  std::string_view name;  // IBV_WR_ without the prefix
  // The QP types it may be posted on (bits of QpTypeBit).
  uint8_t qp_types;
  enum class Kind : uint8_t { kSend, kWrite, kRead, kAtomic, kLocal } kind;
  bool immediate;      // carries immediate data (the last packet's ImmDt)
  bool invalidate;     // SEND with invalidate (IETH)
  bool carries_data;   // has SGEs: gathered and sent (SEND, WRITE) or filled by the answer (READ, atomics)
  bool allows_inline;  // IBV_SEND_INLINE is valid: "only for SEND and RDMA_WRITE" (ibv_wr_post(3))
  WcOpcode completion;  // the send completion's wc.opcode
};

inline constexpr uint8_t QpTypeBit(QpType type) {
  switch (type) {
    case QpType::kRc: return 1;
    case QpType::kUc: return 2;
    case QpType::kUd: return 4;
    case QpType::kXrcSend: return 8;
    default: return 0;
  }
}

// The entry for `op`; nullptr for an opcode uroce does not carry (TSO, DRIVER1, ATOMIC_WRITE, unknown values).
const SendOpcodeInfo* FindSendOpcode(SendOpcode op);
// Whether `op` may be posted on a send queue of `type` (EINVAL at post otherwise).
inline bool ValidOn(const SendOpcodeInfo* info, QpType type) { return info && (info->qp_types & QpTypeBit(type)); }

struct Completion {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  WcOpcode opcode = WcOpcode::kSend;
  uint32_t vendor_err = 0;
  uint32_t byte_len = 0;
  uint32_t imm_data = 0;  // network byte order (wire bytes), or the invalidated rkey with kWithInv (host order)
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;
  uint32_t wc_flags = 0;
  uint16_t pkey_index = 0;
  uint16_t slid = 0;
  uint8_t sl = 0;
  uint8_t dlid_path_bits = 0;
  uint64_t timestamp_ns = 0;  // device clock at completion (ibv_wc_read_completion_ts / _wallclock_ns)
  bool solicited = false;     // completes a SEND with the SE bit: wakes solicited-only notification
};

}  // namespace uroce::emu
