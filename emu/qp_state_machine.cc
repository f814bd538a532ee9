#include "emu/qp_state_machine.h"

#include <array>
#include <cerrno>
#include <cstddef>

namespace uroce::emu {

using namespace attr;  // the mask bits read best unqualified, in the table and in the checks

std::string_view ToString(QpState s) {
  switch (s) {
    case QpState::kReset: return "RESET";
    case QpState::kInit: return "INIT";
    case QpState::kRtr: return "RTR";
    case QpState::kRts: return "RTS";
    case QpState::kSqd: return "SQD";
    case QpState::kSqe: return "SQE";
    case QpState::kErr: return "ERR";
  }
  return "UNKNOWN";
}

std::string_view ToString(QpType t) {
  switch (t) {
    case QpType::kRc: return "RC";
    case QpType::kUc: return "UC";
    case QpType::kUd: return "UD";
    case QpType::kRawPacket: return "RAW_PACKET";
    case QpType::kXrcSend: return "XRC_SEND";
    case QpType::kXrcRecv: return "XRC_RECV";
  }
  return "UNKNOWN";
}

namespace {

constexpr size_t kNumStates = 7;  // RESET .. ERR
constexpr size_t kNumTypes = 6;   // dense index of the QpTypes we know, see TypeIndex

// Dense index of a QpType, or kNumTypes for a value we do not know.
constexpr size_t TypeIndex(QpType t) {
  switch (t) {
    case QpType::kRc: return 0;
    case QpType::kUc: return 1;
    case QpType::kUd: return 2;
    case QpType::kRawPacket: return 3;
    case QpType::kXrcSend: return 4;
    case QpType::kXrcRecv: return 5;
  }
  return kNumTypes;
}

// A set of QP types, one bit per TypeIndex.
using TypeSet = uint8_t;
constexpr TypeSet kRc = 1u << 0;
constexpr TypeSet kUc = 1u << 1;
constexpr TypeSet kUd = 1u << 2;
constexpr TypeSet kRaw = 1u << 3;
constexpr TypeSet kXrcSend = 1u << 4;  // IB_QPT_XRC_INI in the kernel
constexpr TypeSet kXrcRecv = 1u << 5;  // IB_QPT_XRC_TGT in the kernel
constexpr TypeSet kAllTypes = kRc | kUc | kUd | kRaw | kXrcSend | kXrcRecv;

using S = QpState;

// One row: the transition cur -> next exists for every type in `types`, with these required and optional attributes.
struct Row {
  QpState cur;
  QpState next;
  TypeSet types;
  uint32_t required;
  uint32_t optional;
};

// The modify_qp transition table, IBTA vol1 11.2.4.2 (the table of required and optional attributes per state
// transition and service type), as the kernel applies it in drivers/infiniband/core/verbs.c qp_state_table (cited
// below as [cur][next]). A (cur, next, type) missing here is not a transition: EINVAL. Every valid transition is
// listed for every type, including those whose only attribute is the state, so nothing is valid by default.
//
// Deliberate choices, each matching the kernel rather than a looser reading of the spec's state diagram:
// - RESET -> ERR is not a transition ([RESET] has only RESET and INIT); every other state may go to ERR and RESET.
// - RTR -> RTR and SQE -> SQE do not exist; a modify without kState in RTR or SQE is therefore EINVAL.
// - RC and XRC QPs never enter SQE (a send error takes them to ERR, IBTA 10.3.1), but SQE -> RTS is still listed for
//   them with no attributes, as the kernel's row is valid for every type.
// - RAW_PACKET rows follow the kernel (port at RESET -> INIT, rate limit at RTR -> RTS and RTS -> RTS); the device may
//   refuse to create such QPs at all, but the table stays complete.
constexpr Row kTable[] = {
    // [RESET][RESET]: resetting a reset QP is allowed and takes nothing but the state.
    {S::kReset, S::kReset, kAllTypes, 0, 0},

    // [RESET][INIT]: the port, the partition, and the Q_Key (datagram) or remote access rights (connected).
    {S::kReset, S::kInit, kUd, kPkeyIndex | kPort | kQkey, 0},
    {S::kReset, S::kInit, kRc | kUc | kXrcSend | kXrcRecv, kPkeyIndex | kPort | kAccessFlags, 0},
    {S::kReset, S::kInit, kRaw, kPort, 0},

    // [INIT][INIT]: the RESET -> INIT attributes may be changed again, all optional.
    {S::kInit, S::kInit, kUd, 0, kPkeyIndex | kPort | kQkey},
    {S::kInit, S::kInit, kRc | kUc | kXrcSend | kXrcRecv, 0, kPkeyIndex | kPort | kAccessFlags},
    {S::kInit, S::kInit, kRaw, 0, 0},

    // [INIT][RTR]: connected QPs learn their peer (AV, MTU, QPN) and expected PSN; a responder (RC, XRC target) also
    // its inbound RDMA read/atomic depth and RNR NAK timer.
    {S::kInit, S::kRtr, kUd, 0, kPkeyIndex | kQkey},
    {S::kInit, S::kRtr, kUc | kXrcSend, kAv | kPathMtu | kDestQpn | kRqPsn, kAltPath | kAccessFlags | kPkeyIndex},
    {S::kInit, S::kRtr, kRc | kXrcRecv,
     kAv | kPathMtu | kDestQpn | kRqPsn | kMaxDestRdAtomic | kMinRnrTimer, kAltPath | kAccessFlags | kPkeyIndex},
    {S::kInit, S::kRtr, kRaw, 0, 0},

    // [RTR][RTS]: the send side: starting PSN; a requester (RC, XRC initiator) also its ACK timeout, retry counts
    // and outbound read/atomic depth; an XRC target only timeout and PSN.
    {S::kRtr, S::kRts, kUd, kSqPsn, kCurState | kQkey},
    {S::kRtr, S::kRts, kUc, kSqPsn, kCurState | kAltPath | kAccessFlags | kPathMigState},
    {S::kRtr, S::kRts, kRc, kTimeout | kRetryCnt | kRnrRetry | kSqPsn | kMaxQpRdAtomic,
     kCurState | kAltPath | kAccessFlags | kMinRnrTimer | kPathMigState},
    {S::kRtr, S::kRts, kXrcSend, kTimeout | kRetryCnt | kRnrRetry | kSqPsn | kMaxQpRdAtomic,
     kCurState | kAltPath | kAccessFlags | kPathMigState},
    {S::kRtr, S::kRts, kXrcRecv, kTimeout | kSqPsn,
     kCurState | kAltPath | kAccessFlags | kMinRnrTimer | kPathMigState},
    {S::kRtr, S::kRts, kRaw, 0, kRateLimit},

    // [RTS][RTS]: the attributes an operating QP may change in place.
    {S::kRts, S::kRts, kUd, 0, kCurState | kQkey},
    {S::kRts, S::kRts, kUc | kXrcSend, 0, kCurState | kAccessFlags | kAltPath | kPathMigState},
    {S::kRts, S::kRts, kRc | kXrcRecv, 0, kCurState | kAccessFlags | kAltPath | kPathMigState | kMinRnrTimer},
    {S::kRts, S::kRts, kRaw, 0, kRateLimit},

    // [RTS][SQD]: start draining; the consumer may ask for the "SQ drained" event.
    {S::kRts, S::kSqd, kAllTypes & ~kRaw, 0, kEnSqdAsyncNotify},
    {S::kRts, S::kSqd, kRaw, 0, 0},

    // [SQD][RTS]: resume; the same in-place attributes as RTS -> RTS (no rate limit).
    {S::kSqd, S::kRts, kUd, 0, kCurState | kQkey},
    {S::kSqd, S::kRts, kUc | kXrcSend, 0, kCurState | kAltPath | kAccessFlags | kPathMigState},
    {S::kSqd, S::kRts, kRc | kXrcRecv, 0, kCurState | kAltPath | kAccessFlags | kMinRnrTimer | kPathMigState},
    {S::kSqd, S::kRts, kRaw, 0, 0},

    // [SQD][SQD]: a drained QP may change its path and timing attributes.
    {S::kSqd, S::kSqd, kUd, 0, kPkeyIndex | kQkey},
    {S::kSqd, S::kSqd, kUc, 0, kAv | kAltPath | kAccessFlags | kPkeyIndex | kPathMigState},
    {S::kSqd, S::kSqd, kRc, 0,
     kPort | kAv | kTimeout | kRetryCnt | kRnrRetry | kMaxQpRdAtomic | kMaxDestRdAtomic | kAltPath | kAccessFlags |
         kPkeyIndex | kMinRnrTimer | kPathMigState},
    {S::kSqd, S::kSqd, kXrcSend, 0,
     kPort | kAv | kTimeout | kRetryCnt | kRnrRetry | kMaxQpRdAtomic | kAltPath | kAccessFlags | kPkeyIndex |
         kPathMigState},
    {S::kSqd, S::kSqd, kXrcRecv, 0,
     kPort | kAv | kTimeout | kMaxDestRdAtomic | kAltPath | kAccessFlags | kPkeyIndex | kMinRnrTimer |
         kPathMigState},
    {S::kSqd, S::kSqd, kRaw, 0, 0},

    // [SQE][RTS]: recover from a send queue error (UD, UC).
    {S::kSqe, S::kRts, kUd, 0, kCurState | kQkey},
    {S::kSqe, S::kRts, kUc, 0, kCurState | kAccessFlags},
    {S::kSqe, S::kRts, kRc | kRaw | kXrcSend | kXrcRecv, 0, 0},

    // [X][RESET] and [X][ERR] for every X but RESET -> ERR; ERR -> ERR included.
    {S::kInit, S::kReset, kAllTypes, 0, 0},
    {S::kInit, S::kErr, kAllTypes, 0, 0},
    {S::kRtr, S::kReset, kAllTypes, 0, 0},
    {S::kRtr, S::kErr, kAllTypes, 0, 0},
    {S::kRts, S::kReset, kAllTypes, 0, 0},
    {S::kRts, S::kErr, kAllTypes, 0, 0},
    {S::kSqd, S::kReset, kAllTypes, 0, 0},
    {S::kSqd, S::kErr, kAllTypes, 0, 0},
    {S::kSqe, S::kReset, kAllTypes, 0, 0},
    {S::kSqe, S::kErr, kAllTypes, 0, 0},
    {S::kErr, S::kReset, kAllTypes, 0, 0},
    {S::kErr, S::kErr, kAllTypes, 0, 0},
};

using DenseTable = std::array<std::array<std::array<TransitionRule, kNumTypes>, kNumStates>, kNumStates>;

// Expands kTable into [cur][next][type] for constant-time lookup. Runs at compile time: a (cur, next, type) listed
// twice, or a row mentioning kState, stops the build.
constexpr DenseTable BuildDenseTable() {
  DenseTable dense{};
  for (const Row& row : kTable) {
    if (((row.required | row.optional) & kState) != 0 || (row.required & row.optional) != 0) {
      throw "a row names kState, or a bit both required and optional";
    }
    for (size_t t = 0; t < kNumTypes; ++t) {
      if ((row.types & (1u << t)) == 0) continue;
      TransitionRule& rule = dense[static_cast<size_t>(row.cur)][static_cast<size_t>(row.next)][t];
      if (rule.valid) throw "a (cur, next, type) is listed twice";
      rule = TransitionRule{true, row.required, row.optional};
    }
  }
  return dense;
}

constexpr DenseTable kDense = BuildDenseTable();

constexpr bool IsKnownState(QpState s) { return static_cast<size_t>(s) < kNumStates; }

// PSNs and QPNs are 24-bit fields of the BTH / DETH (IBTA 9.2, 9.3.2).
constexpr uint32_t k24BitLimit = 1u << 24;

// The qp_access_flags a QP accepts: every flag <infiniband/verbs.h> (rdma-core v44) defines in bits 0..7, and the
// IBV_ACCESS_OPTIONAL range (bits 20..29), whose flags a device may ignore by definition. Only the remote-access bits
// mean anything to a QP; the others are accepted because programs commonly pass their MR flags here and the kernel
// ignores them too. Bits 8..19 and 30..31 are undefined: EINVAL.
constexpr uint32_t kOptionalAccessRange = ((1u << 10) - 1) << 20;
constexpr uint32_t kKnownQpAccessFlags = access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead |
                                         access::kRemoteAtomic | access::kMwBind | access::kZeroBased |
                                         access::kOnDemand | access::kHugetlb | kOptionalAccessRange;
static_assert((access::kRelaxedOrdering & kOptionalAccessRange) == access::kRelaxedOrdering);

// Value checks of an address vector given with kAv. The port is 1 (the device has one port); the source GID index
// must name an entry of the GID table; RoCE carries a GRH on every packet (IBTA annex A17, RoCEv2), so the AV must be
// global, as the kernel's rdma_check_ah_attr requires for RoCE AVs. A flow label wider than the GRH's 20 bits is
// not an error: HCAs and rxe keep its low 20 bits (`StoredAddressVector`), and UCX passes ~0.
int ValidateAddressVector(const AddressVector& av, const DeviceLimits& limits) {
  if (av.port_num != 1) return EINVAL;
  if (!av.is_global) return EINVAL;
  if (av.sgid_index >= limits.gid_table_len) return EINVAL;
  return 0;
}

int ValidateCapabilities(const QpCapabilities& cap, const DeviceLimits& limits) {
  if (cap.max_send_wr > limits.max_qp_wr || cap.max_recv_wr > limits.max_qp_wr) return EINVAL;
  if (cap.max_send_sge > limits.max_sge || cap.max_recv_sge > limits.max_sge) return EINVAL;
  if (cap.max_inline_data > limits.max_inline_data) return EINVAL;
  return 0;
}

// May a modify that names `claimed` as the current state (kCurState) run on a QP whose real state is `actual`?
// The attribute exists for a consumer whose idea of the state differs from the device's (ibv_modify_qp(3)). Our
// device's state is authoritative, so the only legitimate difference is one the device made on its own without the
// consumer having seen it yet: a UD/UC QP falling from RTS to SQE on a send error (IBTA 10.3.1, SQE). A consumer
// that says RTS while the QP is in SQE is therefore accepted; any other mismatch is EINVAL.
bool CurrentStateConsistent(QpState claimed, QpState actual) {
  if (claimed == actual) return true;
  return claimed == QpState::kRts && actual == QpState::kSqe;
}

}  // namespace

TransitionRule RuleFor(QpState cur, QpState next, QpType type) {
  const size_t t = TypeIndex(type);
  if (!IsKnownState(cur) || !IsKnownState(next) || t >= kNumTypes) return TransitionRule{false, 0, 0};
  return kDense[static_cast<size_t>(cur)][static_cast<size_t>(next)][t];
}

int CheckTransition(QpState cur, QpState next, QpType type, uint32_t mask) {
  // Without kState the QP stays where it is (ibv_modify_qp(3)); naming another state requires the bit.
  if ((mask & kState) == 0 && next != cur) return EINVAL;
  const TransitionRule rule = RuleFor(cur, next, type);
  if (!rule.valid) return EINVAL;
  if ((mask & rule.required) != rule.required) return EINVAL;
  if ((mask & ~(rule.required | rule.optional | kState)) != 0) return EINVAL;
  return 0;
}

int ValidateAttributes(const QpAttributes& attr, uint32_t mask, QpState cur_state, QpType type,
                       const DeviceLimits& limits, Mtu active_mtu) {
  // The QP type itself must be one we know; every other check is per attribute.
  if (TypeIndex(type) >= kNumTypes) return EINVAL;

  if ((mask & kState) && !IsKnownState(attr.qp_state)) return EINVAL;

  if (mask & kCurState) {
    if (!IsKnownState(attr.cur_qp_state)) return EINVAL;
    if (!CurrentStateConsistent(attr.cur_qp_state, cur_state)) return EINVAL;
  }

  if ((mask & kAccessFlags) && (attr.qp_access_flags & ~kKnownQpAccessFlags) != 0) return EINVAL;

  // One port, numbered 1 (ibv_query_device reports phys_port_cnt = 1).
  if ((mask & kPort) && attr.port_num != 1) return EINVAL;

  if ((mask & kPkeyIndex) && attr.pkey_index >= limits.max_pkeys) return EINVAL;

  if (mask & kAv) {
    if (int err = ValidateAddressVector(attr.ah_attr, limits); err != 0) return err;
  }

  // Path MTU: a code of enum ibv_mtu (1..5 for 256..4096 bytes), no larger than the port's active MTU, which bounds
  // every packet the port can carry.
  if (mask & kPathMtu) {
    const uint32_t code = static_cast<uint32_t>(attr.path_mtu);
    if (!IsValidMtu(code) || code > static_cast<uint32_t>(active_mtu)) return EINVAL;
  }

  // Local ACK timeout is a 5-bit exponent, 4.096 us * 2^timeout (IBTA 9.7.6.1.3, 0 = infinite); retry counts are
  // 3-bit fields (IBTA 9.7.6.1.3 / 9.7.5.2.8, rnr_retry 7 = infinite); the RNR NAK timer is the 5-bit code an RNR NAK
  // carries in its AETH (IBTA 9.7.5.2.8).
  if ((mask & kTimeout) && attr.timeout > 31) return EINVAL;
  if ((mask & kRetryCnt) && attr.retry_cnt > 7) return EINVAL;
  if ((mask & kRnrRetry) && attr.rnr_retry > 7) return EINVAL;
  if ((mask & kMinRnrTimer) && attr.min_rnr_timer > 31) return EINVAL;

  // Outstanding RDMA read / atomic depth: as initiator (max_rd_atomic) and as responder (max_dest_rd_atomic), within
  // what ibv_query_device reports (IBTA 11.2.4.2; max_qp_init_rd_atom and max_qp_rd_atom of ibv_device_attr).
  if ((mask & kMaxQpRdAtomic) && attr.max_rd_atomic > limits.max_qp_init_rd_atom) return EINVAL;
  if ((mask & kMaxDestRdAtomic) && attr.max_dest_rd_atomic > limits.max_qp_rd_atom) return EINVAL;

  // 24-bit fields. The kernel silently masks over-wide PSNs to 24 bits; we refuse them, so a caller's mistake shows.
  // PSNs are 24-bit; like the kernel's rxe and real HCAs we keep the low 24 bits of a wider value (ApplyAttributes)
  // rather than refuse it: programs seed PSNs with lrand48() and some forget the mask.
  if ((mask & kDestQpn) && attr.dest_qp_num >= k24BitLimit) return EINVAL;

  // Path migration state: one of enum ibv_mig_state. Without alternate paths only MIGRATED has an effect, but the
  // others are well-formed values the consumer may store.
  if ((mask & kPathMigState) && static_cast<uint8_t>(attr.path_mig_state) > static_cast<uint8_t>(MigState::kArmed)) {
    return EINVAL;
  }

  if ((mask & kCap) && ValidateCapabilities(attr.cap, limits) != 0) return EINVAL;

  // Alternate paths (automatic path migration) are not supported: RoCE has no APM, and the kernel rejects an
  // alternate path on a RoCE port with EINVAL (_ib_modify_qp in core/verbs.c). We answer the same, so programs
  // written against real RoCE hardware see what they would see there.
  if (mask & kAltPath) return EINVAL;

  // Everything above is a malformed request; what follows is well-formed but unsupported.
  //
  // Rate limiting (packet pacing, IBV_QP_RATE_LIMIT): 0 means "no limit", which is what we do; any other value asks
  // for pacing the device does not implement.
  if ((mask & kRateLimit) && attr.rate_limit != 0) return EOPNOTSUPP;

  return 0;
}

int CheckSqDrain(QpState cur, QpState next, bool sq_draining) {
  if (cur != QpState::kSqd || !sq_draining) return 0;
  return (next == QpState::kErr || next == QpState::kReset) ? 0 : EINVAL;
}

int CheckModify(const QpAttributes& current, const QpAttributes& attr, uint32_t mask, QpType type,
                const DeviceLimits& limits, Mtu active_mtu) {
  const QpState cur = current.qp_state;
  const QpState next = (mask & kState) ? attr.qp_state : cur;
  if (int err = CheckTransition(cur, next, type, mask); err != 0) return err;
  if (int err = ValidateAttributes(attr, mask, cur, type, limits, active_mtu); err != 0) return err;
  return CheckSqDrain(cur, next, current.sq_draining);
}

void ApplyAttributes(QpAttributes& current, const QpAttributes& attr, uint32_t mask) {
  if (mask & kState) {
    current.qp_state = attr.qp_state;
    current.cur_qp_state = attr.qp_state;
    // Only an SQD QP drains. Whether entering SQD starts a drain depends on work in flight, which only the engine
    // knows: it sets sq_draining then, and clears it when the drain completes (raising IBV_EVENT_SQ_DRAINED).
    if (attr.qp_state != QpState::kSqd) current.sq_draining = false;
  }
  // kCurState only qualifies the request; it stores nothing.
  if (mask & kEnSqdAsyncNotify) current.en_sqd_async_notify = attr.en_sqd_async_notify;
  if (mask & kAccessFlags) current.qp_access_flags = attr.qp_access_flags;
  if (mask & kPkeyIndex) current.pkey_index = attr.pkey_index;
  if (mask & kPort) current.port_num = attr.port_num;
  if (mask & kQkey) current.qkey = attr.qkey;
  if (mask & kAv) current.ah_attr = StoredAddressVector(attr.ah_attr);
  if (mask & kPathMtu) current.path_mtu = attr.path_mtu;
  if (mask & kTimeout) current.timeout = attr.timeout;
  if (mask & kRetryCnt) current.retry_cnt = attr.retry_cnt;
  if (mask & kRnrRetry) current.rnr_retry = attr.rnr_retry;
  if (mask & kRqPsn) current.rq_psn = attr.rq_psn & (k24BitLimit - 1);
  if (mask & kMaxQpRdAtomic) current.max_rd_atomic = attr.max_rd_atomic;
  if (mask & kAltPath) {
    current.alt_ah_attr = StoredAddressVector(attr.alt_ah_attr);
    current.alt_pkey_index = attr.alt_pkey_index;
    current.alt_port_num = attr.alt_port_num;
    current.alt_timeout = attr.alt_timeout;
  }
  if (mask & kMinRnrTimer) current.min_rnr_timer = attr.min_rnr_timer;
  if (mask & kSqPsn) current.sq_psn = attr.sq_psn & (k24BitLimit - 1);
  if (mask & kMaxDestRdAtomic) current.max_dest_rd_atomic = attr.max_dest_rd_atomic;
  if (mask & kPathMigState) current.path_mig_state = attr.path_mig_state;
  if (mask & kCap) current.cap = attr.cap;
  if (mask & kDestQpn) current.dest_qp_num = attr.dest_qp_num;
  if (mask & kRateLimit) current.rate_limit = attr.rate_limit;
}

}  // namespace uroce::emu
