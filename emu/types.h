// Vocabulary of the emulated HCA. The numeric values of states, types, opcodes, statuses and attribute-mask bits are
// those of the verbs API (enum ibv_qp_state, ibv_qp_type, ibv_wr_opcode, ibv_wc_status, ibv_qp_attr_mask in
// <infiniband/verbs.h>), so verbs_api translates by value; but emu never includes verbs.h: it is the device, not the
// library. static_asserts in verbs_api pin each value against the real header.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace uroce::emu {

// IBTA vol1 10.3.1 / 11.2.4: QP states.
enum class QpState : uint8_t { kReset = 0, kInit = 1, kRtr = 2, kRts = 3, kSqd = 4, kSqe = 5, kErr = 6 };
std::string_view ToString(QpState s);

enum class QpType : uint8_t { kRc = 2, kUc = 3, kUd = 4, kRawPacket = 8, kXrcSend = 9, kXrcRecv = 10 };
std::string_view ToString(QpType t);

// Path MTU codes (IBTA 9.7.8 / enum ibv_mtu): 1=256 ... 5=4096.
enum class Mtu : uint8_t { k256 = 1, k512 = 2, k1024 = 3, k2048 = 4, k4096 = 5 };
constexpr uint32_t MtuBytes(Mtu m) { return 128u << static_cast<uint8_t>(m); }
constexpr bool IsValidMtu(uint32_t code) { return code >= 1 && code <= 5; }

// Attribute mask bits of modify_qp / query_qp (values of enum ibv_qp_attr_mask).
namespace attr {
inline constexpr uint32_t kState = 1u << 0;
inline constexpr uint32_t kCurState = 1u << 1;
inline constexpr uint32_t kEnSqdAsyncNotify = 1u << 2;
inline constexpr uint32_t kAccessFlags = 1u << 3;
inline constexpr uint32_t kPkeyIndex = 1u << 4;
inline constexpr uint32_t kPort = 1u << 5;
inline constexpr uint32_t kQkey = 1u << 6;
inline constexpr uint32_t kAv = 1u << 7;
inline constexpr uint32_t kPathMtu = 1u << 8;
inline constexpr uint32_t kTimeout = 1u << 9;
inline constexpr uint32_t kRetryCnt = 1u << 10;
inline constexpr uint32_t kRnrRetry = 1u << 11;
inline constexpr uint32_t kRqPsn = 1u << 12;
inline constexpr uint32_t kMaxQpRdAtomic = 1u << 13;
inline constexpr uint32_t kAltPath = 1u << 14;
inline constexpr uint32_t kMinRnrTimer = 1u << 15;
inline constexpr uint32_t kSqPsn = 1u << 16;
inline constexpr uint32_t kMaxDestRdAtomic = 1u << 17;
inline constexpr uint32_t kPathMigState = 1u << 18;
inline constexpr uint32_t kCap = 1u << 19;
inline constexpr uint32_t kDestQpn = 1u << 20;
// 1 << 21..24 are reserved in ibv_qp_attr_mask; 1 << 25 is IBV_QP_RATE_LIMIT.
inline constexpr uint32_t kRateLimit = 1u << 25;
inline constexpr uint32_t kAll = (1u << 21) - 1;  // the bits the IBTA table speaks of
}  // namespace attr

// Remote/local access flags of MRs and QPs (enum ibv_access_flags).
namespace access {
inline constexpr uint32_t kLocalWrite = 1u << 0;
inline constexpr uint32_t kRemoteWrite = 1u << 1;
inline constexpr uint32_t kRemoteRead = 1u << 2;
inline constexpr uint32_t kRemoteAtomic = 1u << 3;
inline constexpr uint32_t kMwBind = 1u << 4;
inline constexpr uint32_t kZeroBased = 1u << 5;
inline constexpr uint32_t kOnDemand = 1u << 6;
inline constexpr uint32_t kHugetlb = 1u << 7;
inline constexpr uint32_t kRelaxedOrdering = 1u << 20;  // IBV_ACCESS_OPTIONAL_FIRST
}  // namespace access

// Path migration states (enum ibv_mig_state).
enum class MigState : uint8_t { kMigrated = 0, kRearm = 1, kArmed = 2 };

// An address vector: where a connected QP's packets go (ibv_ah_attr with a GRH; RoCE always carries one).
struct AddressVector {
  std::array<uint8_t, 16> dgid{};
  uint32_t flow_label = 0;
  uint8_t sgid_index = 0;
  // The GID sgid_index named when the device took the address vector (Device::ModifyQp, CreateAh): the local address
  // its packets leave from, kept as the kernel keeps a QP's sgid_attr, so a later change of the table moves nothing.
  std::array<uint8_t, 16> sgid{};
  uint8_t hop_limit = 64;
  uint8_t traffic_class = 0;
  uint8_t sl = 0;
  uint8_t static_rate = 0;
  uint8_t port_num = 1;
  uint16_t dlid = 0;
  uint8_t src_path_bits = 0;
  bool is_global = true;
};

// The GRH flow label is 20 bits (IBTA 8.3.1).
inline constexpr uint32_t kFlowLabelMask = (1u << 20) - 1;

// An address vector as the device keeps it: the flow label cut to its 20 bits, as HCAs and rxe do.
inline AddressVector StoredAddressVector(AddressVector av) {
  av.flow_label &= kFlowLabelMask;
  return av;
}

struct QpCapabilities {
  uint32_t max_send_wr = 0;
  uint32_t max_recv_wr = 0;
  uint32_t max_send_sge = 0;
  uint32_t max_recv_sge = 0;
  uint32_t max_inline_data = 0;
};

// Everything modify_qp can set and query_qp reports (the emu image of struct ibv_qp_attr).
struct QpAttributes {
  QpState qp_state = QpState::kReset;
  QpState cur_qp_state = QpState::kReset;
  Mtu path_mtu = Mtu::k1024;
  MigState path_mig_state = MigState::kMigrated;
  uint32_t qkey = 0;
  uint32_t rq_psn = 0;
  uint32_t sq_psn = 0;
  uint32_t dest_qp_num = 0;
  uint32_t qp_access_flags = 0;
  QpCapabilities cap;
  AddressVector ah_attr;
  AddressVector alt_ah_attr;
  uint16_t pkey_index = 0;
  uint16_t alt_pkey_index = 0;
  bool en_sqd_async_notify = false;
  bool sq_draining = false;
  uint8_t max_rd_atomic = 0;
  uint8_t max_dest_rd_atomic = 0;
  uint8_t min_rnr_timer = 0;
  uint8_t port_num = 1;
  uint8_t timeout = 0;
  uint8_t retry_cnt = 0;
  uint8_t rnr_retry = 0;
  uint8_t alt_port_num = 0;
  uint8_t alt_timeout = 0;
  uint32_t rate_limit = 0;
};

// The limits the device reports (ibv_query_device) and enforces; one place, so README's table and the checks agree.
struct DeviceLimits {
  uint32_t max_qp = 16384;
  uint32_t max_qp_wr = 16384;
  uint32_t max_sge = 32;
  uint32_t max_sge_rd = 32;
  uint32_t max_cq = 16384;
  uint32_t max_cqe = (1u << 20) - 1;
  uint32_t max_mr = 65536;
  uint64_t max_mr_size = ~uint64_t{0};
  uint32_t max_pd = 65536;
  uint32_t max_qp_rd_atom = 128;
  uint32_t max_qp_init_rd_atom = 128;
  uint32_t max_srq = 16384;
  uint32_t max_srq_wr = 16384;
  uint32_t max_srq_sge = 32;
  uint32_t max_ah = 65536;
  uint32_t max_inline_data = 256;
  uint32_t max_mw = 65536;
  // UD multicast (IBTA 10.5): groups the device is attached to, QPs per group, attachments in all. Each group the
  // process receives costs the engine one UDP socket (wire::MulticastReceiver), so groups stay well below the usual
  // 1024-descriptor limit; attachments are list entries.
  uint32_t max_mcast_grp = 256;
  uint32_t max_mcast_qp_attach = 256;
  uint32_t max_total_mcast_qp_attach = 65536;
  uint16_t max_pkeys = 1;
  // Entries of the port's GID table (ibv_port_attr.gid_tbl_len), populated or not (DeviceCore::gids says which).
  uint32_t gid_table_len = 16;
  uint8_t local_ca_ack_delay = 15;
  uint32_t max_msg_sz = 1u << 31;
};

}  // namespace uroce::emu
