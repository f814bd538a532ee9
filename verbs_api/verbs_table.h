// The function tables that verbs.h's inline verbs call through (ibv_context_ops, verbs_context), and the verbs behind
// them, shared between the files that implement them.
#pragma once

#include <infiniband/verbs.h>

namespace uroce::verbs {

void FillContextOps(verbs_context* v);
void FillMemoryOps(verbs_context* v);
void FillSrqOps(verbs_context* v);  // SRQ and XRC (srq_verbs.cc)

// Device memory one ibv_alloc_dm may take (query_device_ex's max_dm_size).
inline constexpr size_t kMaxDmBytes = size_t{64} << 20;

// Registers [addr, addr+length) at `iova` in `pd` and wraps it in an ibv_mr; NULL with errno on failure.
ibv_mr* RegisterMemory(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access);

int QueryPort(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_len);
int QueryDeviceEx(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                  size_t attr_size);
int PollCq(ibv_cq* cq, int num_entries, ibv_wc* wc);
int ReqNotifyCq(ibv_cq* cq, int solicited_only);
ibv_cq_ex* CreateCqEx(ibv_context* context, ibv_cq_init_attr_ex* attr);
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
ibv_qp* CreateQpEx(ibv_context* context, ibv_qp_init_attr_ex* attr);
ibv_mw* AllocMw(ibv_pd* pd, ibv_mw_type type);
int DeallocMw(ibv_mw* mw);
int BindMw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mw_bind);
ibv_pd* AllocParentDomain(ibv_context* context, ibv_parent_domain_init_attr* attr);

}  // namespace uroce::verbs
