// The QP state machine of modify_qp: which transitions exist, which attributes each one requires and allows
// (IBTA vol1 11.2.4.2 "Modify Queue Pair" and its table of state-transition attributes; the Linux kernel encodes
// the same table as qp_state_table in drivers/infiniband/core/verbs.c, which every kernel provider applies), and
// the value checks an attribute must pass before the QP takes it.
//
// A modify is checked in this order, and changes nothing unless every step returns 0:
//   next = (mask & attr::kState) ? attr.qp_state : current.qp_state;
//   CheckTransition(current.qp_state, next, type, mask)        -> is the mask right for this transition?
//   ValidateAttributes(attr, mask, current.qp_state, ...)     -> is every supplied value in range?
//   CheckSqDrain(current.qp_state, next, current.sq_draining) -> is the QP in a state that can take it now?
//   ApplyAttributes(current, attr, mask)
// CheckModify() runs the three checks in that order.
#pragma once

#include <cstdint>

#include "emu/types.h"

namespace uroce::emu {

// What a transition demands of the attribute mask. `required` and `optional` never contain attr::kState: that bit is
// implied by changing state (see CheckTransition).
struct TransitionRule {
  bool valid;
  uint32_t required;
  uint32_t optional;
};

// The rule for moving a QP of `type` from `cur` to `next` (IBTA 11.2.4.2). Out-of-range states or types (values that
// arrived through the C ABI) give an invalid rule.
TransitionRule RuleFor(QpState cur, QpState next, QpType type);

// 0 if `mask` is acceptable for moving from `cur` to `next`: the transition exists for `type`, every required bit is
// present, no bit lies outside required | optional | kState, and kState is present when next != cur (without
// kState the modify stays in `cur`, so the mask must suit the cur -> cur rule). Else EINVAL.
int CheckTransition(QpState cur, QpState next, QpType type, uint32_t mask);

// Value checks for the attributes named in `mask` (fields not in `mask` are ignored). `cur_state` is the QP's real
// state; `active_mtu` is the port's active MTU. Returns 0, EINVAL for a malformed or out-of-range value, or
// EOPNOTSUPP for a well-formed request the device does not implement (a non-zero rate_limit). Every EINVAL check
// runs before the EOPNOTSUPP one, so EOPNOTSUPP means "valid, but not here".
int ValidateAttributes(const QpAttributes& attr, uint32_t mask, QpState cur_state, QpType type,
                       const DeviceLimits& limits, Mtu active_mtu);

// Not in the lead's brief; added here because ValidateAttributes cannot see the QP's drain status. While an SQD QP
// is still draining its send queue (`sq_draining`), it may only leave for ERR or RESET: changing attributes
// (SQD -> SQD) or resuming (SQD -> RTS) waits for the drain to finish (IBTA 10.3.1: attributes of an SQD QP are
// changed once the SQ has drained; the kernel's rxe rejects the same requests with EINVAL). 0 or EINVAL.
int CheckSqDrain(QpState cur, QpState next, bool sq_draining);

// CheckTransition, ValidateAttributes and CheckSqDrain in that order, for a QP whose stored attributes are
// `current`; returns the first non-zero result.
int CheckModify(const QpAttributes& current, const QpAttributes& attr, uint32_t mask, QpType type,
                const DeviceLimits& limits, Mtu active_mtu);

// Copies the fields of `attr` named in `mask` into `current` (the QP's stored attributes). Call only after the checks
// passed. With kState, cur_qp_state follows qp_state (query_qp reports it as the current state), and sq_draining is
// cleared on any move to a state other than SQD. Setting it is the engine's business: on RTS -> SQD with work in
// flight it sets sq_draining, and clears it when the drain completes.
void ApplyAttributes(QpAttributes& current, const QpAttributes& attr, uint32_t mask);

}  // namespace uroce::emu
