// The extended send-ops API of ibv_create_qp_ex (IBV_QP_INIT_ATTR_SEND_OPS_FLAGS): the ibv_wr_* builders and setters
// that verbs.h's inline ibv_wr_* functions call through struct ibv_qp_ex (man ibv_wr_post(3)).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "verbs_api/internal.h"

namespace uroce::verbs {

// Fills qp->qpx's function pointers for the work request builders requested in `send_ops_flags`
// (enum ibv_qp_create_send_ops_flags), plus the always-present wr_start/wr_complete/wr_abort and data setters,
// wr_set_ud_addr for UD and wr_set_xrc_srqn for XRC_SEND; the rest stay NULL. Allocates the per-QP batch state
// (qp->send_ops), which also makes ibv_qp_to_qp_ex() return &qp->qpx.
// Returns 0, or EOPNOTSUPP when a flag is unknown, is TSO, or names an operation the QP type does not have
// (ibv_wr_post(3) table: UD send/send_imm; UC + rdma_write/rdma_write_imm; RC and XRC_SEND all ten), ENOMEM.
int InstallSendOps(Qp* qp, uint64_t send_ops_flags, ibv_qp_type qp_type);

// Frees what InstallSendOps allocated; a no-op for a QP created without send ops. Call before freeing the Qp.
void ReleaseSendOps(Qp* qp);

}  // namespace uroce::verbs
