// Conformance of the modify_qp state machine. The expected table is written here a second time, independently of
// qp_state_machine.cc and in another form: lines of attribute NAMES per (service type, transition), as the IBTA
// vol1 11.2.4.2 tables list them, with the mask values of enum ibv_qp_attr_mask typed in from <infiniband/verbs.h>.
// The walk then checks every (type, cur, next) of RC, UC, UD, XRC_SEND, XRC_RECV and RAW_PACKET against it.
#include "emu/qp_state_machine.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace uroce::emu {

// gtest prints a parameter with this (found by argument-dependent lookup, so outside the anonymous namespace).
void PrintTo(QpType type, std::ostream* out) { *out << ToString(type); }

namespace {

// ---------------------------------------------------------------------------------------------------------------
// The spec table, as text.

// enum ibv_qp_attr_mask, by name (values from <infiniband/verbs.h>, not from emu/types.h).
const std::map<std::string, uint32_t>& MaskBitsByName() {
  static const auto* names = new std::map<std::string, uint32_t>{
      {"STATE", 1u << 0},          {"CUR_STATE", 1u << 1},     {"EN_SQD_ASYNC_NOTIFY", 1u << 2},
      {"ACCESS_FLAGS", 1u << 3},   {"PKEY_INDEX", 1u << 4},    {"PORT", 1u << 5},
      {"QKEY", 1u << 6},           {"AV", 1u << 7},            {"PATH_MTU", 1u << 8},
      {"TIMEOUT", 1u << 9},        {"RETRY_CNT", 1u << 10},    {"RNR_RETRY", 1u << 11},
      {"RQ_PSN", 1u << 12},        {"MAX_QP_RD_ATOMIC", 1u << 13}, {"ALT_PATH", 1u << 14},
      {"MIN_RNR_TIMER", 1u << 15}, {"SQ_PSN", 1u << 16},       {"MAX_DEST_RD_ATOMIC", 1u << 17},
      {"PATH_MIG_STATE", 1u << 18}, {"CAP", 1u << 19},         {"DEST_QPN", 1u << 20},
      {"RATE_LIMIT", 1u << 25},
  };
  return *names;
}
constexpr uint32_t kStateBit = 1u << 0;

// One line per (types, transition): "TYPES  CUR -> NEXT | required names | optional names". TYPES is a comma list of
// RC UC UD RAW_PACKET XRC_SEND XRC_RECV, or * for all six. A (type, cur, next) not listed is not a transition.
constexpr const char* kSpecTable = R"(
*                     RESET -> RESET |                                                  |
UD                    RESET -> INIT  | PKEY_INDEX PORT QKEY                             |
RC,UC,XRC_SEND        RESET -> INIT  | PKEY_INDEX PORT ACCESS_FLAGS                     |
XRC_RECV              RESET -> INIT  | ACCESS_FLAGS PORT PKEY_INDEX                     |
RAW_PACKET            RESET -> INIT  | PORT                                             |

UD                    INIT -> INIT   |                                                  | PKEY_INDEX PORT QKEY
RC,UC,XRC_SEND,XRC_RECV INIT -> INIT |                                                  | PKEY_INDEX PORT ACCESS_FLAGS
RAW_PACKET            INIT -> INIT   |                                                  |

UD                    INIT -> RTR    |                                                  | PKEY_INDEX QKEY
UC                    INIT -> RTR    | AV PATH_MTU DEST_QPN RQ_PSN                      | ALT_PATH ACCESS_FLAGS PKEY_INDEX
XRC_SEND              INIT -> RTR    | AV PATH_MTU DEST_QPN RQ_PSN                      | ALT_PATH ACCESS_FLAGS PKEY_INDEX
RC                    INIT -> RTR    | AV PATH_MTU DEST_QPN RQ_PSN MAX_DEST_RD_ATOMIC MIN_RNR_TIMER | ALT_PATH ACCESS_FLAGS PKEY_INDEX
XRC_RECV              INIT -> RTR    | AV PATH_MTU DEST_QPN RQ_PSN MAX_DEST_RD_ATOMIC MIN_RNR_TIMER | ALT_PATH ACCESS_FLAGS PKEY_INDEX
RAW_PACKET            INIT -> RTR    |                                                  |

UD                    RTR -> RTS     | SQ_PSN                                           | CUR_STATE QKEY
UC                    RTR -> RTS     | SQ_PSN                                           | CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE
RC                    RTR -> RTS     | TIMEOUT RETRY_CNT RNR_RETRY SQ_PSN MAX_QP_RD_ATOMIC | CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE
XRC_SEND              RTR -> RTS     | TIMEOUT RETRY_CNT RNR_RETRY SQ_PSN MAX_QP_RD_ATOMIC | CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE
XRC_RECV              RTR -> RTS     | TIMEOUT SQ_PSN                                   | CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE
RAW_PACKET            RTR -> RTS     |                                                  | RATE_LIMIT

UD                    RTS -> RTS     |                                                  | CUR_STATE QKEY
UC                    RTS -> RTS     |                                                  | CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE
XRC_SEND              RTS -> RTS     |                                                  | CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE
RC                    RTS -> RTS     |                                                  | CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE MIN_RNR_TIMER
XRC_RECV              RTS -> RTS     |                                                  | CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE MIN_RNR_TIMER
RAW_PACKET            RTS -> RTS     |                                                  | RATE_LIMIT

RC,UC,UD,XRC_SEND,XRC_RECV RTS -> SQD |                                                 | EN_SQD_ASYNC_NOTIFY
RAW_PACKET            RTS -> SQD     |                                                  |

UD                    SQD -> RTS     |                                                  | CUR_STATE QKEY
UC                    SQD -> RTS     |                                                  | CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE
XRC_SEND              SQD -> RTS     |                                                  | CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE
RC                    SQD -> RTS     |                                                  | CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE
XRC_RECV              SQD -> RTS     |                                                  | CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE
RAW_PACKET            SQD -> RTS     |                                                  |

UD                    SQD -> SQD     |                                                  | PKEY_INDEX QKEY
UC                    SQD -> SQD     |                                                  | AV ALT_PATH ACCESS_FLAGS PKEY_INDEX PATH_MIG_STATE
RC                    SQD -> SQD     |                                                  | PORT AV TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC MAX_DEST_RD_ATOMIC ALT_PATH ACCESS_FLAGS PKEY_INDEX MIN_RNR_TIMER PATH_MIG_STATE
XRC_SEND              SQD -> SQD     |                                                  | PORT AV TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC ALT_PATH ACCESS_FLAGS PKEY_INDEX PATH_MIG_STATE
XRC_RECV              SQD -> SQD     |                                                  | PORT AV TIMEOUT MAX_DEST_RD_ATOMIC ALT_PATH ACCESS_FLAGS PKEY_INDEX MIN_RNR_TIMER PATH_MIG_STATE
RAW_PACKET            SQD -> SQD     |                                                  |

UD                    SQE -> RTS     |                                                  | CUR_STATE QKEY
UC                    SQE -> RTS     |                                                  | CUR_STATE ACCESS_FLAGS
RC,RAW_PACKET,XRC_SEND,XRC_RECV SQE -> RTS |                                            |

*                     INIT -> RESET  |                                                  |
*                     RTR -> RESET   |                                                  |
*                     RTS -> RESET   |                                                  |
*                     SQD -> RESET   |                                                  |
*                     SQE -> RESET   |                                                  |
*                     ERR -> RESET   |                                                  |
*                     INIT -> ERR    |                                                  |
*                     RTR -> ERR     |                                                  |
*                     RTS -> ERR     |                                                  |
*                     SQD -> ERR     |                                                  |
*                     SQE -> ERR     |                                                  |
*                     ERR -> ERR     |                                                  |
)";

const std::vector<QpType>& AllTypes() {
  static const auto* types = new std::vector<QpType>{QpType::kRc,        QpType::kUc,      QpType::kUd,
                                                     QpType::kRawPacket, QpType::kXrcSend, QpType::kXrcRecv};
  return *types;
}

const std::vector<QpState>& AllStates() {
  static const auto* states = new std::vector<QpState>{QpState::kReset, QpState::kInit, QpState::kRtr, QpState::kRts,
                                                       QpState::kSqd,   QpState::kSqe,  QpState::kErr};
  return *states;
}

struct Expected {
  uint32_t required = 0;
  uint32_t optional = 0;
};
using Key = std::tuple<QpType, QpState, QpState>;

std::vector<std::string> Words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

uint32_t MaskOf(const std::string& names) {
  uint32_t mask = 0;
  for (const std::string& name : Words(names)) {
    auto it = MaskBitsByName().find(name);
    if (it == MaskBitsByName().end()) {
      ADD_FAILURE() << "unknown attribute name in spec table: " << name;
      continue;
    }
    mask |= it->second;
  }
  return mask;
}

QpState StateNamed(const std::string& name) {
  for (QpState s : AllStates()) {
    if (ToString(s) == name) return s;
  }
  ADD_FAILURE() << "unknown state in spec table: " << name;
  return QpState::kReset;
}

std::vector<QpType> TypesNamed(const std::string& list) {
  if (list == "*") return AllTypes();
  std::vector<QpType> types;
  std::string rest = list;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string name = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    bool found = false;
    for (QpType t : AllTypes()) {
      if (ToString(t) == name) {
        types.push_back(t);
        found = true;
      }
    }
    if (!found) ADD_FAILURE() << "unknown QP type in spec table: " << name;
  }
  return types;
}

// Parses kSpecTable once.
const std::map<Key, Expected>& SpecTable() {
  static const auto* table = [] {
    auto* t = new std::map<Key, Expected>;
    std::istringstream lines(kSpecTable);
    for (std::string line; std::getline(lines, line);) {
      if (Words(line).empty()) continue;
      const size_t bar1 = line.find('|');
      const size_t bar2 = line.find('|', bar1 + 1);
      if (bar1 == std::string::npos || bar2 == std::string::npos) {
        ADD_FAILURE() << "malformed spec line: " << line;
        continue;
      }
      const std::vector<std::string> head = Words(line.substr(0, bar1));
      if (head.size() != 4 || head[2] != "->") {
        ADD_FAILURE() << "malformed spec line: " << line;
        continue;
      }
      const Expected e{MaskOf(line.substr(bar1 + 1, bar2 - bar1 - 1)), MaskOf(line.substr(bar2 + 1))};
      for (QpType type : TypesNamed(head[0])) {
        const Key key{type, StateNamed(head[1]), StateNamed(head[3])};
        if (!t->emplace(key, e).second) ADD_FAILURE() << "spec line repeats a transition: " << line;
      }
    }
    return t;
  }();
  return *table;
}

std::string Describe(QpType type, QpState cur, QpState next) {
  return std::string(ToString(type)) + " " + std::string(ToString(cur)) + "->" + std::string(ToString(next));
}

std::string Hex(uint32_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

// ---------------------------------------------------------------------------------------------------------------
// The walk.

TEST(QpStateMachineConformance, SpecTableParsesToTheExpectedShape) {
  // Per type: RESET->{RESET,INIT}, INIT->{RESET,ERR,INIT,RTR}, RTR->{RESET,ERR,RTS}, RTS->{RESET,ERR,RTS,SQD},
  // SQD->{RESET,ERR,RTS,SQD}, SQE->{RESET,ERR,RTS}, ERR->{RESET,ERR}: 22 transitions.
  EXPECT_EQ(SpecTable().size(), 22u * AllTypes().size());
  for (QpType type : AllTypes()) {
    int count = 0;
    for (const auto& [key, e] : SpecTable()) count += std::get<0>(key) == type;
    EXPECT_EQ(count, 22) << ToString(type);
  }
}

TEST(QpStateMachineConformance, RuleForMatchesTheSpecTable) {
  for (QpType type : AllTypes()) {
    for (QpState cur : AllStates()) {
      for (QpState next : AllStates()) {
        const auto it = SpecTable().find(Key{type, cur, next});
        const TransitionRule rule = RuleFor(cur, next, type);
        SCOPED_TRACE(Describe(type, cur, next));
        if (it == SpecTable().end()) {
          EXPECT_FALSE(rule.valid);
          continue;
        }
        ASSERT_TRUE(rule.valid);
        EXPECT_EQ(Hex(rule.required), Hex(it->second.required));
        EXPECT_EQ(Hex(rule.optional), Hex(it->second.optional));
      }
    }
  }
}

class TransitionWalk : public ::testing::TestWithParam<QpType> {};

// Every valid transition: the exact required set is accepted; required plus each optional bit alone, and plus all of
// them, is accepted; dropping any required bit, or adding any bit outside required|optional|STATE (all 32 mask bits
// are tried), is EINVAL; and a change of state without STATE is EINVAL.
TEST_P(TransitionWalk, EveryValidTransitionEveryBit) {
  const QpType type = GetParam();
  int accepted = 0, rejected = 0;
  for (QpState cur : AllStates()) {
    for (QpState next : AllStates()) {
      const auto it = SpecTable().find(Key{type, cur, next});
      if (it == SpecTable().end()) continue;
      SCOPED_TRACE(Describe(type, cur, next));
      const uint32_t req = it->second.required;
      const uint32_t opt = it->second.optional;
      const uint32_t base = req | kStateBit;

      auto accept = [&](uint32_t mask) {
        EXPECT_EQ(CheckTransition(cur, next, type, mask), 0) << "mask " << Hex(mask);
        ++accepted;
      };
      auto reject = [&](uint32_t mask) {
        EXPECT_EQ(CheckTransition(cur, next, type, mask), EINVAL) << "mask " << Hex(mask);
        ++rejected;
      };

      accept(base);
      accept(base | opt);
      for (int bit = 0; bit < 32; ++bit) {
        const uint32_t b = 1u << bit;
        if (opt & b) accept(base | b);
        if (req & b) {
          reject(base & ~b);
          reject((base | opt) & ~b);
        }
        if (((req | opt | kStateBit) & b) == 0) {
          reject(base | b);
          reject(base | opt | b);
        }
      }
      if (cur == next) {
        // Without STATE the QP stays put: the cur->cur rule applies as it is.
        accept(req);
        accept(req | opt);
      } else {
        reject(req);
        reject(req | opt);
      }
    }
  }
  RecordProperty("accepted", accepted);
  RecordProperty("rejected", rejected);
  EXPECT_GT(accepted, 0);
}

// Every transition the spec does not list is EINVAL for every mask of bits 0..20 (with and without STATE), and for
// the mask of all 32 bits.
TEST_P(TransitionWalk, EveryInvalidTransitionEveryMask) {
  const QpType type = GetParam();
  int pairs = 0;
  for (QpState cur : AllStates()) {
    for (QpState next : AllStates()) {
      if (SpecTable().count(Key{type, cur, next})) continue;
      ++pairs;
      SCOPED_TRACE(Describe(type, cur, next));
      ASSERT_FALSE(RuleFor(cur, next, type).valid);
      uint32_t wrongly_accepted = 0;
      for (uint32_t mask = 0; mask < (1u << 21); ++mask) {
        if (CheckTransition(cur, next, type, mask) != EINVAL) ++wrongly_accepted;
      }
      EXPECT_EQ(wrongly_accepted, 0u);
      EXPECT_EQ(CheckTransition(cur, next, type, ~0u), EINVAL);
    }
  }
  EXPECT_EQ(pairs, 49 - 22);
}

// Every valid transition against every mask of bits 0..20: accepted exactly when it holds all required names, no name
// outside required + optional + STATE, and STATE unless the QP stays in its state (IBTA 11.2.4.2, ibv_modify_qp(3)).
TEST_P(TransitionWalk, EveryValidTransitionEveryMask) {
  const QpType type = GetParam();
  for (QpState cur : AllStates()) {
    for (QpState next : AllStates()) {
      const auto it = SpecTable().find(Key{type, cur, next});
      if (it == SpecTable().end()) continue;
      SCOPED_TRACE(Describe(type, cur, next));
      const uint32_t req = it->second.required;
      const uint32_t allowed = req | it->second.optional | kStateBit;
      uint32_t mismatches = 0, first_mismatch = 0;
      for (uint32_t mask = 0; mask < (1u << 21); ++mask) {
        const bool ok = (mask & req) == req && (mask & ~allowed) == 0 && ((mask & kStateBit) != 0 || cur == next);
        if (CheckTransition(cur, next, type, mask) != (ok ? 0 : EINVAL) && mismatches++ == 0) first_mismatch = mask;
      }
      EXPECT_EQ(mismatches, 0u) << "first at mask " << Hex(first_mismatch);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, TransitionWalk, ::testing::ValuesIn(AllTypes()),
                         [](const ::testing::TestParamInfo<QpType>& info) {
                           return std::string(ToString(info.param));
                         });

TEST(QpStateMachineConformance, NamedTransitionsFromTheIssue) {
  using namespace attr;
  // Skipping a state is never allowed.
  EXPECT_EQ(CheckTransition(QpState::kReset, QpState::kRts, QpType::kRc, ~0u), EINVAL);
  EXPECT_EQ(CheckTransition(QpState::kInit, QpState::kRts, QpType::kRc, kState | kSqPsn), EINVAL);
  EXPECT_EQ(CheckTransition(QpState::kReset, QpState::kRtr, QpType::kUd, kState), EINVAL);
  // RESET -> RESET takes only the state; any -> RESET and any -> ERR (but RESET -> ERR) likewise.
  EXPECT_EQ(CheckTransition(QpState::kReset, QpState::kReset, QpType::kRc, kState), 0);
  EXPECT_EQ(CheckTransition(QpState::kReset, QpState::kErr, QpType::kRc, kState), EINVAL);
  EXPECT_EQ(CheckTransition(QpState::kRts, QpState::kErr, QpType::kRc, kState), 0);
  EXPECT_EQ(CheckTransition(QpState::kRts, QpState::kErr, QpType::kRc, kState | kCurState), EINVAL);
  EXPECT_EQ(CheckTransition(QpState::kErr, QpState::kReset, QpType::kXrcRecv, kState), 0);
  // The UD Q_Key: required at RESET -> INIT, optional afterwards, foreign to RC.
  EXPECT_EQ(CheckTransition(QpState::kReset, QpState::kInit, QpType::kUd, kState | kPkeyIndex | kPort), EINVAL);
  EXPECT_EQ(CheckTransition(QpState::kRts, QpState::kRts, QpType::kUd, kQkey), 0);
  EXPECT_EQ(CheckTransition(QpState::kRts, QpState::kRts, QpType::kRc, kQkey), EINVAL);
  // A modify without STATE in RTR has no rule to follow (there is no RTR -> RTR).
  EXPECT_EQ(CheckTransition(QpState::kRtr, QpState::kRtr, QpType::kRc, 0), EINVAL);
  // IBV_QP_CAP is in no transition.
  EXPECT_EQ(CheckTransition(QpState::kInit, QpState::kInit, QpType::kRc, kCap), EINVAL);
  // Out-of-range values from the ABI.
  EXPECT_EQ(CheckTransition(QpState::kReset, static_cast<QpState>(7), QpType::kRc, kState), EINVAL);
  EXPECT_EQ(CheckTransition(static_cast<QpState>(200), QpState::kErr, QpType::kRc, kState), EINVAL);
  EXPECT_EQ(CheckTransition(QpState::kReset, QpState::kInit, static_cast<QpType>(1),
                            kState | kPkeyIndex | kPort | kAccessFlags),
            EINVAL);
  EXPECT_FALSE(RuleFor(QpState::kReset, QpState::kReset, static_cast<QpType>(0)).valid);
}

TEST(QpStateMachineConformance, ToStringNames) {
  const std::vector<std::string> states = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  for (size_t i = 0; i < states.size(); ++i) EXPECT_EQ(ToString(static_cast<QpState>(i)), states[i]);
  EXPECT_EQ(ToString(QpType::kRc), "RC");
  EXPECT_EQ(ToString(QpType::kUc), "UC");
  EXPECT_EQ(ToString(QpType::kUd), "UD");
  EXPECT_EQ(ToString(QpType::kRawPacket), "RAW_PACKET");
  EXPECT_EQ(ToString(QpType::kXrcSend), "XRC_SEND");
  EXPECT_EQ(ToString(QpType::kXrcRecv), "XRC_RECV");
  EXPECT_EQ(ToString(static_cast<QpState>(9)), "UNKNOWN");
  EXPECT_EQ(ToString(static_cast<QpType>(0)), "UNKNOWN");
}

// The mask bits of types.h agree with the names typed in above from verbs.h.
TEST(QpStateMachineConformance, MaskBitsAgreeWithVerbsNames) {
  using namespace attr;
  const std::map<std::string, uint32_t> ours = {
      {"STATE", kState},           {"CUR_STATE", kCurState},         {"EN_SQD_ASYNC_NOTIFY", kEnSqdAsyncNotify},
      {"ACCESS_FLAGS", kAccessFlags}, {"PKEY_INDEX", kPkeyIndex},    {"PORT", kPort},
      {"QKEY", kQkey},             {"AV", kAv},                      {"PATH_MTU", kPathMtu},
      {"TIMEOUT", kTimeout},       {"RETRY_CNT", kRetryCnt},         {"RNR_RETRY", kRnrRetry},
      {"RQ_PSN", kRqPsn},          {"MAX_QP_RD_ATOMIC", kMaxQpRdAtomic}, {"ALT_PATH", kAltPath},
      {"MIN_RNR_TIMER", kMinRnrTimer}, {"SQ_PSN", kSqPsn},           {"MAX_DEST_RD_ATOMIC", kMaxDestRdAtomic},
      {"PATH_MIG_STATE", kPathMigState}, {"CAP", kCap},              {"DEST_QPN", kDestQpn},
      {"RATE_LIMIT", kRateLimit},
  };
  EXPECT_EQ(ours, MaskBitsByName());
}

// ---------------------------------------------------------------------------------------------------------------
// Value checks.

// A request in which every field holds a valid value, with the mask of every field ValidateAttributes accepts.
QpAttributes GoodAttributes() {
  QpAttributes a;
  a.qp_state = QpState::kRts;
  a.cur_qp_state = QpState::kRts;
  a.path_mtu = Mtu::k1024;
  a.path_mig_state = MigState::kMigrated;
  a.qkey = 0x11111111;
  a.rq_psn = 0x123456;
  a.sq_psn = 0x654321;
  a.dest_qp_num = 0x000abc;
  a.qp_access_flags = access::kRemoteWrite | access::kRemoteRead | access::kRemoteAtomic;
  a.cap = QpCapabilities{16, 16, 2, 2, 64};
  a.ah_attr.sgid_index = 0;
  a.ah_attr.port_num = 1;
  a.ah_attr.is_global = true;
  a.pkey_index = 0;
  a.max_rd_atomic = 4;
  a.max_dest_rd_atomic = 4;
  a.min_rnr_timer = 12;
  a.port_num = 1;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.rate_limit = 0;
  return a;
}

// Every bit with a value check, but ALT_PATH (always refused) — RATE_LIMIT included (0 is valid).
constexpr uint32_t kGoodMask = (attr::kAll & ~attr::kAltPath) | attr::kRateLimit;

DeviceLimits TestLimits() {
  DeviceLimits l;
  l.max_pkeys = 4;
  l.gid_table_len = 2;
  l.max_qp_init_rd_atom = 8;
  l.max_qp_rd_atom = 16;
  l.max_qp_wr = 1024;
  l.max_sge = 8;
  l.max_inline_data = 256;
  return l;
}

constexpr Mtu kActiveMtu = Mtu::k2048;

int Validate(const QpAttributes& a, uint32_t mask, QpState cur = QpState::kRts, QpType type = QpType::kRc) {
  return ValidateAttributes(a, mask, cur, type, TestLimits(), kActiveMtu);
}

TEST(QpValidateAttributes, GoodRequestPassesForEveryType) {
  for (QpType type : AllTypes()) EXPECT_EQ(Validate(GoodAttributes(), kGoodMask, QpState::kRts, type), 0);
}

struct ValueCase {
  const char* name;
  uint32_t bit;
  void (*set)(QpAttributes&);
  int expected;
};

// Each case changes one field of GoodAttributes(); with its bit in the mask the result is `expected`, without it 0.
const ValueCase kValueCases[] = {
    // port_num: the device has port 1 only.
    {"port 1", attr::kPort, [](QpAttributes& a) { a.port_num = 1; }, 0},
    {"port 0", attr::kPort, [](QpAttributes& a) { a.port_num = 0; }, EINVAL},
    {"port 2", attr::kPort, [](QpAttributes& a) { a.port_num = 2; }, EINVAL},
    // pkey_index < max_pkeys (4).
    {"pkey_index 3", attr::kPkeyIndex, [](QpAttributes& a) { a.pkey_index = 3; }, 0},
    {"pkey_index 4", attr::kPkeyIndex, [](QpAttributes& a) { a.pkey_index = 4; }, EINVAL},
    {"pkey_index 0xffff", attr::kPkeyIndex, [](QpAttributes& a) { a.pkey_index = 0xffff; }, EINVAL},
    // path_mtu: codes 1..5, at most the active MTU (2048).
    {"mtu 256", attr::kPathMtu, [](QpAttributes& a) { a.path_mtu = Mtu::k256; }, 0},
    {"mtu 2048 = active", attr::kPathMtu, [](QpAttributes& a) { a.path_mtu = Mtu::k2048; }, 0},
    {"mtu 4096 > active", attr::kPathMtu, [](QpAttributes& a) { a.path_mtu = Mtu::k4096; }, EINVAL},
    {"mtu code 0", attr::kPathMtu, [](QpAttributes& a) { a.path_mtu = static_cast<Mtu>(0); }, EINVAL},
    {"mtu code 6", attr::kPathMtu, [](QpAttributes& a) { a.path_mtu = static_cast<Mtu>(6); }, EINVAL},
    // timeout <= 31, retry counts <= 7, RNR timer <= 31.
    {"timeout 0", attr::kTimeout, [](QpAttributes& a) { a.timeout = 0; }, 0},
    {"timeout 31", attr::kTimeout, [](QpAttributes& a) { a.timeout = 31; }, 0},
    {"timeout 32", attr::kTimeout, [](QpAttributes& a) { a.timeout = 32; }, EINVAL},
    {"retry_cnt 0", attr::kRetryCnt, [](QpAttributes& a) { a.retry_cnt = 0; }, 0},
    {"retry_cnt 8", attr::kRetryCnt, [](QpAttributes& a) { a.retry_cnt = 8; }, EINVAL},
    {"rnr_retry 0", attr::kRnrRetry, [](QpAttributes& a) { a.rnr_retry = 0; }, 0},
    {"rnr_retry 8", attr::kRnrRetry, [](QpAttributes& a) { a.rnr_retry = 8; }, EINVAL},
    {"min_rnr_timer 31", attr::kMinRnrTimer, [](QpAttributes& a) { a.min_rnr_timer = 31; }, 0},
    {"min_rnr_timer 32", attr::kMinRnrTimer, [](QpAttributes& a) { a.min_rnr_timer = 32; }, EINVAL},
    // max_rd_atomic <= max_qp_init_rd_atom (8); max_dest_rd_atomic <= max_qp_rd_atom (16): not swapped.
    {"max_rd_atomic 8", attr::kMaxQpRdAtomic, [](QpAttributes& a) { a.max_rd_atomic = 8; }, 0},
    {"max_rd_atomic 9", attr::kMaxQpRdAtomic, [](QpAttributes& a) { a.max_rd_atomic = 9; }, EINVAL},
    {"max_dest_rd_atomic 16", attr::kMaxDestRdAtomic, [](QpAttributes& a) { a.max_dest_rd_atomic = 16; }, 0},
    {"max_dest_rd_atomic 17", attr::kMaxDestRdAtomic, [](QpAttributes& a) { a.max_dest_rd_atomic = 17; }, EINVAL},
    // 24-bit PSNs and QPN.
    {"rq_psn 0xffffff", attr::kRqPsn, [](QpAttributes& a) { a.rq_psn = 0xffffff; }, 0},
    {"rq_psn 2^24 (masked to 24 bits, as real HCAs do)", attr::kRqPsn, [](QpAttributes& a) { a.rq_psn = 1u << 24; }, 0},
    {"sq_psn 0xffffff", attr::kSqPsn, [](QpAttributes& a) { a.sq_psn = 0xffffff; }, 0},
    {"sq_psn 0xffffffff (masked)", attr::kSqPsn, [](QpAttributes& a) { a.sq_psn = 0xffffffff; }, 0},
    {"dest_qp_num 0xffffff", attr::kDestQpn, [](QpAttributes& a) { a.dest_qp_num = 0xffffff; }, 0},
    {"dest_qp_num 2^24", attr::kDestQpn, [](QpAttributes& a) { a.dest_qp_num = 1u << 24; }, EINVAL},
    // cur_qp_state (the QP is in RTS): its own state only.
    {"cur_qp_state RTS", attr::kCurState, [](QpAttributes& a) { a.cur_qp_state = QpState::kRts; }, 0},
    {"cur_qp_state SQE", attr::kCurState, [](QpAttributes& a) { a.cur_qp_state = QpState::kSqe; }, EINVAL},
    {"cur_qp_state INIT", attr::kCurState, [](QpAttributes& a) { a.cur_qp_state = QpState::kInit; }, EINVAL},
    {"cur_qp_state 7", attr::kCurState, [](QpAttributes& a) { a.cur_qp_state = static_cast<QpState>(7); }, EINVAL},
    {"qp_state 7", attr::kState, [](QpAttributes& a) { a.qp_state = static_cast<QpState>(7); }, EINVAL},
    // Access flags: the defined ibv_access_flags and the optional range.
    {"access 0", attr::kAccessFlags, [](QpAttributes& a) { a.qp_access_flags = 0; }, 0},
    {"access bits 0..7", attr::kAccessFlags, [](QpAttributes& a) { a.qp_access_flags = 0xff; }, 0},
    {"access relaxed ordering", attr::kAccessFlags,
     [](QpAttributes& a) { a.qp_access_flags = access::kRelaxedOrdering; }, 0},
    {"access optional bit 29", attr::kAccessFlags, [](QpAttributes& a) { a.qp_access_flags = 1u << 29; }, 0},
    {"access bit 8", attr::kAccessFlags, [](QpAttributes& a) { a.qp_access_flags = 1u << 8; }, EINVAL},
    {"access bit 19", attr::kAccessFlags, [](QpAttributes& a) { a.qp_access_flags = 1u << 19; }, EINVAL},
    {"access bit 30", attr::kAccessFlags, [](QpAttributes& a) { a.qp_access_flags = 1u << 30; }, EINVAL},
    {"access bit 31", attr::kAccessFlags, [](QpAttributes& a) { a.qp_access_flags = 1u << 31; }, EINVAL},
    // Address vector: sgid_index < gid table length (2), port 1, global; any flow label.
    {"av sgid_index 1", attr::kAv, [](QpAttributes& a) { a.ah_attr.sgid_index = 1; }, 0},
    {"av sgid_index 2", attr::kAv, [](QpAttributes& a) { a.ah_attr.sgid_index = 2; }, EINVAL},
    {"av port 0", attr::kAv, [](QpAttributes& a) { a.ah_attr.port_num = 0; }, EINVAL},
    {"av port 2", attr::kAv, [](QpAttributes& a) { a.ah_attr.port_num = 2; }, EINVAL},
    {"av not global", attr::kAv, [](QpAttributes& a) { a.ah_attr.is_global = false; }, EINVAL},
    {"av flow label 2^20-1", attr::kAv, [](QpAttributes& a) { a.ah_attr.flow_label = (1u << 20) - 1; }, 0},
    {"av flow label ~0 (low 20 bits kept, as HCAs do)", attr::kAv, [](QpAttributes& a) { a.ah_attr.flow_label = ~0u; },
     0},
    // Capabilities within the device limits.
    {"cap at limits", attr::kCap, [](QpAttributes& a) { a.cap = QpCapabilities{1024, 1024, 8, 8, 256}; }, 0},
    {"cap send_wr", attr::kCap, [](QpAttributes& a) { a.cap.max_send_wr = 1025; }, EINVAL},
    {"cap recv_wr", attr::kCap, [](QpAttributes& a) { a.cap.max_recv_wr = 1025; }, EINVAL},
    {"cap send_sge", attr::kCap, [](QpAttributes& a) { a.cap.max_send_sge = 9; }, EINVAL},
    {"cap recv_sge", attr::kCap, [](QpAttributes& a) { a.cap.max_recv_sge = 9; }, EINVAL},
    {"cap inline", attr::kCap, [](QpAttributes& a) { a.cap.max_inline_data = 257; }, EINVAL},
    // Path migration state: a value of enum ibv_mig_state.
    {"mig REARM", attr::kPathMigState, [](QpAttributes& a) { a.path_mig_state = MigState::kRearm; }, 0},
    {"mig ARMED", attr::kPathMigState, [](QpAttributes& a) { a.path_mig_state = MigState::kArmed; }, 0},
    {"mig 3", attr::kPathMigState, [](QpAttributes& a) { a.path_mig_state = static_cast<MigState>(3); }, EINVAL},
    // Rate limit: 0 is "unlimited"; pacing is well-formed but unsupported.
    {"rate_limit 0", attr::kRateLimit, [](QpAttributes& a) { a.rate_limit = 0; }, 0},
    {"rate_limit 1000", attr::kRateLimit, [](QpAttributes& a) { a.rate_limit = 1000; }, EOPNOTSUPP},
};

TEST(QpValidateAttributes, EachRuleAtItsBoundary) {
  for (const ValueCase& c : kValueCases) {
    SCOPED_TRACE(c.name);
    QpAttributes a = GoodAttributes();
    c.set(a);
    EXPECT_EQ(Validate(a, kGoodMask), c.expected);  // among all the other (valid) fields
    EXPECT_EQ(Validate(a, c.bit), c.expected);      // alone
    EXPECT_EQ(Validate(a, kGoodMask & ~c.bit), 0);  // a field outside the mask is not looked at
  }
}

TEST(QpValidateAttributes, CurrentStateMaySayRtsWhileTheQpFellToSqe) {
  QpAttributes a = GoodAttributes();
  a.cur_qp_state = QpState::kRts;
  EXPECT_EQ(Validate(a, attr::kCurState, QpState::kSqe, QpType::kUd), 0);
  a.cur_qp_state = QpState::kSqe;
  EXPECT_EQ(Validate(a, attr::kCurState, QpState::kSqe, QpType::kUd), 0);
  a.cur_qp_state = QpState::kRtr;
  EXPECT_EQ(Validate(a, attr::kCurState, QpState::kSqe, QpType::kUd), EINVAL);
  for (QpState s : AllStates()) {
    a.cur_qp_state = s;
    EXPECT_EQ(Validate(a, attr::kCurState, s, QpType::kUc), 0) << ToString(s);
  }
}

TEST(QpValidateAttributes, PathMtuIsBoundedByTheActiveMtu) {
  QpAttributes a = GoodAttributes();
  for (uint8_t active = 1; active <= 5; ++active) {
    for (uint8_t code = 0; code <= 7; ++code) {
      a.path_mtu = static_cast<Mtu>(code);
      const int expected = (code >= 1 && code <= active) ? 0 : EINVAL;
      EXPECT_EQ(ValidateAttributes(a, attr::kPathMtu, QpState::kInit, QpType::kRc, TestLimits(),
                                   static_cast<Mtu>(active)),
                expected)
          << "code " << int(code) << " active " << int(active);
    }
  }
}

TEST(QpValidateAttributes, AlternatePathIsRefused) {
  QpAttributes a = GoodAttributes();
  a.alt_ah_attr = a.ah_attr;
  a.alt_port_num = 1;
  EXPECT_EQ(Validate(a, attr::kAltPath), EINVAL);
  EXPECT_EQ(Validate(a, kGoodMask | attr::kAltPath), EINVAL);
}

TEST(QpValidateAttributes, MalformedBeatsUnsupported) {
  QpAttributes a = GoodAttributes();
  a.rate_limit = 1000;
  EXPECT_EQ(Validate(a, attr::kRateLimit, QpState::kRts, QpType::kRawPacket), EOPNOTSUPP);
  a.timeout = 40;
  EXPECT_EQ(Validate(a, attr::kRateLimit | attr::kTimeout), EINVAL);
}

TEST(QpValidateAttributes, EmptyMaskLooksAtNothing) {
  QpAttributes bad;
  bad.qp_state = static_cast<QpState>(99);
  bad.cur_qp_state = static_cast<QpState>(99);
  bad.path_mtu = static_cast<Mtu>(0);
  bad.path_mig_state = static_cast<MigState>(9);
  bad.rq_psn = bad.sq_psn = bad.dest_qp_num = ~0u;
  bad.qp_access_flags = ~0u;
  bad.cap = QpCapabilities{~0u, ~0u, ~0u, ~0u, ~0u};
  bad.ah_attr.port_num = 9;
  bad.ah_attr.is_global = false;
  bad.pkey_index = 0xffff;
  bad.max_rd_atomic = bad.max_dest_rd_atomic = bad.min_rnr_timer = bad.port_num = bad.timeout = 0xff;
  bad.retry_cnt = bad.rnr_retry = 0xff;
  bad.rate_limit = 5;
  EXPECT_EQ(Validate(bad, 0), 0);
  EXPECT_EQ(Validate(bad, attr::kQkey | attr::kEnSqdAsyncNotify), 0);  // no value check on these
  EXPECT_EQ(Validate(bad, kGoodMask), EINVAL);
}

TEST(QpValidateAttributes, UnknownTypeIsInvalid) {
  EXPECT_EQ(Validate(GoodAttributes(), 0, QpState::kRts, static_cast<QpType>(7)), EINVAL);
}

// ---------------------------------------------------------------------------------------------------------------
// CheckSqDrain, CheckModify, ApplyAttributes.

TEST(QpSqDrain, WhileDrainingOnlyErrAndResetAreAllowed) {
  for (QpState next : AllStates()) {
    const bool allowed = next == QpState::kErr || next == QpState::kReset;
    EXPECT_EQ(CheckSqDrain(QpState::kSqd, next, true), allowed ? 0 : EINVAL) << ToString(next);
    EXPECT_EQ(CheckSqDrain(QpState::kSqd, next, false), 0) << ToString(next);
  }
  // Only an SQD QP drains.
  EXPECT_EQ(CheckSqDrain(QpState::kRts, QpState::kRts, true), 0);
}

// The fields of QpAttributes that differ between a and b, by name.
std::set<std::string> FieldsThatDiffer(const QpAttributes& a, const QpAttributes& b) {
  std::set<std::string> d;
  auto av_equal = [](const AddressVector& x, const AddressVector& y) {
    return x.dgid == y.dgid && x.flow_label == y.flow_label && x.sgid_index == y.sgid_index &&
           x.hop_limit == y.hop_limit && x.traffic_class == y.traffic_class && x.sl == y.sl &&
           x.static_rate == y.static_rate && x.port_num == y.port_num && x.dlid == y.dlid &&
           x.src_path_bits == y.src_path_bits && x.is_global == y.is_global;
  };
  auto cap_equal = [](const QpCapabilities& x, const QpCapabilities& y) {
    return x.max_send_wr == y.max_send_wr && x.max_recv_wr == y.max_recv_wr && x.max_send_sge == y.max_send_sge &&
           x.max_recv_sge == y.max_recv_sge && x.max_inline_data == y.max_inline_data;
  };
#define UROCE_FIELD(f) \
  if (!(a.f == b.f)) d.insert(#f)
  UROCE_FIELD(qp_state);
  UROCE_FIELD(cur_qp_state);
  UROCE_FIELD(path_mtu);
  UROCE_FIELD(path_mig_state);
  UROCE_FIELD(qkey);
  UROCE_FIELD(rq_psn);
  UROCE_FIELD(sq_psn);
  UROCE_FIELD(dest_qp_num);
  UROCE_FIELD(qp_access_flags);
  UROCE_FIELD(pkey_index);
  UROCE_FIELD(alt_pkey_index);
  UROCE_FIELD(en_sqd_async_notify);
  UROCE_FIELD(sq_draining);
  UROCE_FIELD(max_rd_atomic);
  UROCE_FIELD(max_dest_rd_atomic);
  UROCE_FIELD(min_rnr_timer);
  UROCE_FIELD(port_num);
  UROCE_FIELD(timeout);
  UROCE_FIELD(retry_cnt);
  UROCE_FIELD(rnr_retry);
  UROCE_FIELD(alt_port_num);
  UROCE_FIELD(alt_timeout);
  UROCE_FIELD(rate_limit);
#undef UROCE_FIELD
  if (!cap_equal(a.cap, b.cap)) d.insert("cap");
  if (!av_equal(a.ah_attr, b.ah_attr)) d.insert("ah_attr");
  if (!av_equal(a.alt_ah_attr, b.alt_ah_attr)) d.insert("alt_ah_attr");
  return d;
}

// Two attribute sets that differ in every field (state fields aside).
QpAttributes StoredA() {
  QpAttributes a;
  a.qp_state = QpState::kRts;
  a.cur_qp_state = QpState::kRts;
  a.path_mtu = Mtu::k1024;
  a.path_mig_state = MigState::kMigrated;
  a.qkey = 1;
  a.rq_psn = 2;
  a.sq_psn = 3;
  a.dest_qp_num = 4;
  a.qp_access_flags = 0;
  a.cap = QpCapabilities{1, 1, 1, 1, 0};
  a.ah_attr.sgid_index = 0;
  a.alt_ah_attr.sgid_index = 0;
  a.pkey_index = 0;
  a.alt_pkey_index = 0;
  a.en_sqd_async_notify = false;
  a.max_rd_atomic = 1;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.port_num = 1;
  a.timeout = 1;
  a.retry_cnt = 1;
  a.rnr_retry = 1;
  a.alt_port_num = 0;
  a.alt_timeout = 0;
  a.rate_limit = 0;
  return a;
}

QpAttributes RequestB() {
  QpAttributes b;
  b.qp_state = QpState::kRts;
  b.cur_qp_state = QpState::kRts;
  b.path_mtu = Mtu::k4096;
  b.path_mig_state = MigState::kArmed;
  b.qkey = 11;
  b.rq_psn = 12;
  b.sq_psn = 13;
  b.dest_qp_num = 14;
  b.qp_access_flags = access::kRemoteRead;
  b.cap = QpCapabilities{5, 5, 5, 5, 5};
  b.ah_attr.sgid_index = 1;
  b.alt_ah_attr.sgid_index = 1;
  b.pkey_index = 3;
  b.alt_pkey_index = 3;
  b.en_sqd_async_notify = true;
  b.max_rd_atomic = 5;
  b.max_dest_rd_atomic = 5;
  b.min_rnr_timer = 5;
  b.port_num = 2;
  b.timeout = 5;
  b.retry_cnt = 5;
  b.rnr_retry = 5;
  b.alt_port_num = 2;
  b.alt_timeout = 5;
  b.rate_limit = 5;
  return b;
}

TEST(QpApplyAttributes, EachBitCopiesItsFieldsOnly) {
  // Which stored fields each mask bit carries (ibv_modify_qp(3)).
  const std::map<uint32_t, std::set<std::string>> fields = {
      {attr::kCurState, {}},
      {attr::kEnSqdAsyncNotify, {"en_sqd_async_notify"}},
      {attr::kAccessFlags, {"qp_access_flags"}},
      {attr::kPkeyIndex, {"pkey_index"}},
      {attr::kPort, {"port_num"}},
      {attr::kQkey, {"qkey"}},
      {attr::kAv, {"ah_attr"}},
      {attr::kPathMtu, {"path_mtu"}},
      {attr::kTimeout, {"timeout"}},
      {attr::kRetryCnt, {"retry_cnt"}},
      {attr::kRnrRetry, {"rnr_retry"}},
      {attr::kRqPsn, {"rq_psn"}},
      {attr::kMaxQpRdAtomic, {"max_rd_atomic"}},
      {attr::kAltPath, {"alt_ah_attr", "alt_pkey_index", "alt_port_num", "alt_timeout"}},
      {attr::kMinRnrTimer, {"min_rnr_timer"}},
      {attr::kSqPsn, {"sq_psn"}},
      {attr::kMaxDestRdAtomic, {"max_dest_rd_atomic"}},
      {attr::kPathMigState, {"path_mig_state"}},
      {attr::kCap, {"cap"}},
      {attr::kDestQpn, {"dest_qp_num"}},
      {attr::kRateLimit, {"rate_limit"}},
  };
  // Sanity: A and B differ everywhere the bits reach.
  std::set<std::string> all;
  for (const auto& [bit, f] : fields) all.insert(f.begin(), f.end());
  const std::set<std::string> differ = FieldsThatDiffer(StoredA(), RequestB());
  for (const std::string& f : all) EXPECT_TRUE(differ.count(f)) << f;

  for (const auto& [bit, expected] : fields) {
    QpAttributes stored = StoredA();
    ApplyAttributes(stored, RequestB(), bit);
    EXPECT_EQ(FieldsThatDiffer(stored, StoredA()), expected) << "bit " << Hex(bit);
    // Every copied field now equals the request's.
    for (const std::string& f : FieldsThatDiffer(stored, RequestB())) EXPECT_FALSE(expected.count(f)) << f;
  }
  // The empty mask and unknown bits change nothing.
  QpAttributes stored = StoredA();
  ApplyAttributes(stored, RequestB(), (0xffu << 21) & ~attr::kRateLimit);
  EXPECT_TRUE(FieldsThatDiffer(stored, StoredA()).empty());
}

TEST(QpApplyAttributes, StateMovesCurrentStateAndDrainFlag) {
  QpAttributes stored = StoredA();
  QpAttributes req;
  req.qp_state = QpState::kSqd;
  ApplyAttributes(stored, req, attr::kState);
  EXPECT_EQ(stored.qp_state, QpState::kSqd);
  EXPECT_EQ(stored.cur_qp_state, QpState::kSqd);
  EXPECT_FALSE(stored.sq_draining);  // the engine, which knows what is in flight, starts a drain
  EXPECT_EQ(FieldsThatDiffer(stored, StoredA()), (std::set<std::string>{"qp_state", "cur_qp_state"}));

  stored.sq_draining = true;                   // the engine is draining
  ApplyAttributes(stored, req, attr::kState);  // SQD -> SQD leaves that alone
  EXPECT_TRUE(stored.sq_draining);
  req.qp_state = QpState::kErr;
  ApplyAttributes(stored, req, attr::kState);
  EXPECT_EQ(stored.qp_state, QpState::kErr);
  EXPECT_FALSE(stored.sq_draining);
}

// The masks ibv_rc_pingpong / ibv_ud_pingpong / ibv_xsrq_pingpong use, through CheckModify + ApplyAttributes.
struct Step {
  QpState next;
  uint32_t mask;
};

void Walk(QpType type, const std::vector<Step>& steps) {
  QpAttributes qp;
  const DeviceLimits limits = TestLimits();
  for (const Step& step : steps) {
    QpAttributes req = GoodAttributes();
    req.qp_state = step.next;
    SCOPED_TRACE(Describe(type, qp.qp_state, step.next));
    ASSERT_EQ(CheckModify(qp, req, step.mask, type, limits, kActiveMtu), 0);
    ApplyAttributes(qp, req, step.mask);
    EXPECT_EQ(qp.qp_state, step.next);
  }
}

TEST(QpCheckModify, PingpongSequences) {
  using namespace attr;
  const uint32_t rc_init = kState | kPkeyIndex | kPort | kAccessFlags;
  Walk(QpType::kRc, {{QpState::kInit, rc_init},
                     {QpState::kRtr, kState | kAv | kPathMtu | kDestQpn | kRqPsn | kMaxDestRdAtomic | kMinRnrTimer},
                     {QpState::kRts, kState | kTimeout | kRetryCnt | kRnrRetry | kSqPsn | kMaxQpRdAtomic},
                     {QpState::kSqd, kState | kEnSqdAsyncNotify},
                     {QpState::kErr, kState},
                     {QpState::kReset, kState},
                     {QpState::kInit, rc_init}});
  Walk(QpType::kUc, {{QpState::kInit, rc_init},
                     {QpState::kRtr, kState | kAv | kPathMtu | kDestQpn | kRqPsn},
                     {QpState::kRts, kState | kSqPsn}});
  Walk(QpType::kUd, {{QpState::kInit, kState | kPkeyIndex | kPort | kQkey},
                     {QpState::kRtr, kState},
                     {QpState::kRts, kState | kSqPsn},
                     {QpState::kRts, kQkey}});
  Walk(QpType::kXrcSend, {{QpState::kInit, rc_init},
                          {QpState::kRtr, kState | kAv | kPathMtu | kDestQpn | kRqPsn},
                          {QpState::kRts, kState | kTimeout | kRetryCnt | kRnrRetry | kSqPsn | kMaxQpRdAtomic}});
  Walk(QpType::kXrcRecv,
       {{QpState::kInit, rc_init},
        {QpState::kRtr, kState | kAv | kPathMtu | kDestQpn | kRqPsn | kMaxDestRdAtomic | kMinRnrTimer}});
}

TEST(QpCheckModify, OrderOfChecks) {
  using namespace attr;
  QpAttributes qp;  // RESET
  QpAttributes req = GoodAttributes();
  req.qp_state = QpState::kInit;
  req.port_num = 7;
  // The mask is checked first: a rate limit, which would be EOPNOTSUPP where the table allows it, is EINVAL on RC.
  req.rate_limit = 1000;
  EXPECT_EQ(CheckModify(qp, req, kState | kPort | kPkeyIndex | kAccessFlags | kRateLimit, QpType::kRc, TestLimits(),
                        kActiveMtu),
            EINVAL);
  QpAttributes raw;
  raw.qp_state = QpState::kRtr;
  req.qp_state = QpState::kRts;
  EXPECT_EQ(CheckModify(raw, req, kState | kRateLimit, QpType::kRawPacket, TestLimits(), kActiveMtu), EOPNOTSUPP);
  req.rate_limit = 0;
  EXPECT_EQ(CheckModify(raw, req, kState | kRateLimit, QpType::kRawPacket, TestLimits(), kActiveMtu), 0);
  req.qp_state = QpState::kInit;
  // Then the values.
  EXPECT_EQ(CheckModify(qp, req, kState | kPort | kPkeyIndex | kAccessFlags, QpType::kRc, TestLimits(), kActiveMtu),
            EINVAL);
  req.port_num = 1;
  EXPECT_EQ(CheckModify(qp, req, kState | kPort | kPkeyIndex | kAccessFlags, QpType::kRc, TestLimits(), kActiveMtu),
            0);
  // A draining SQD QP refuses to resume; once drained it may.
  qp.qp_state = QpState::kSqd;
  qp.sq_draining = true;
  req.qp_state = QpState::kRts;
  EXPECT_EQ(CheckModify(qp, req, kState, QpType::kRc, TestLimits(), kActiveMtu), EINVAL);
  EXPECT_EQ(CheckModify(qp, req, kTimeout, QpType::kRc, TestLimits(), kActiveMtu), EINVAL);  // SQD->SQD
  req.qp_state = QpState::kErr;
  EXPECT_EQ(CheckModify(qp, req, kState, QpType::kRc, TestLimits(), kActiveMtu), 0);
  qp.sq_draining = false;
  req.qp_state = QpState::kRts;
  EXPECT_EQ(CheckModify(qp, req, kState, QpType::kRc, TestLimits(), kActiveMtu), 0);
  EXPECT_EQ(CheckModify(qp, req, kTimeout, QpType::kRc, TestLimits(), kActiveMtu), 0);
}

}  // namespace
}  // namespace uroce::emu
