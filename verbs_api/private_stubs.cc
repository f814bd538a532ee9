// IBVERBS_PRIVATE_34: the private ABI between rdma-core's libibverbs and its provider libraries (libmlx5, libefa,
// libmlx4, libmana, ...). uroce's device is built into libibverbs.so.1 and never loads a provider, but Debian's clients
// link some providers directly (perftest: libmlx5.so.1 and libefa.so.1), and the dynamic loader resolves every symbol
// they import before main() (BIND_NOW), so each must exist in this exact node (see libibverbs.map).
//
// What happens to them:
//  - verbs_register_driver_34 is called by each provider's constructor at load time: it does nothing, so the
//    provider is never matched to a device and none of the other functions below is ever reached through it.
//  - the ibv_cmd_* kernel-command wrappers and execute_ioctl fail with EOPNOTSUPP, returned as a positive errno
//    value (rdma-core's cmd layer returns errno values, not -errno) and also left in errno;
//  - functions returning pointers return NULL with errno = EOPNOTSUPP; void ones do nothing.
//  - ibv_query_gid_type is NOT here: it is implemented for real in device_verbs.cc (pyverbs, ibv_devinfo and
//    libmlx5 import it).
//
// Signatures follow rdma-core v44 libibverbs/driver.h and cmd_ioctl.h. Only symbol names are part of the C ABI; the
// parameter lists are kept so the intent is readable, and the types rdma-core's installed headers do not provide
// (driver.h, kern-abi.h are not shipped by libibverbs-dev) are declared incomplete here: only pointers are passed.

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

// Private rdma-core types (driver.h, kern-abi.h, cmd_ioctl.h, rdma/ib_user_verbs.h): never dereferenced here.
struct verbs_device_ops;
struct verbs_context_ops;
struct verbs_sysfs_dev;
struct verbs_xrcd;
struct verbs_mr;
struct verbs_cq;
struct verbs_srq;
struct verbs_qp;
struct verbs_flow_action;
struct verbs_dm;
struct verbs_counters;
struct ibv_command_buffer;
// Kernel command and response layouts (kern-abi.h / rdma/ib_user_verbs.h).
struct ibv_get_context;
struct ib_uverbs_get_context_resp;
struct ib_uverbs_ex_query_device_resp;
struct ibv_alloc_pd;
struct ib_uverbs_alloc_pd_resp;
struct ibv_open_xrcd;
struct ib_uverbs_open_xrcd_resp;
struct ibv_reg_mr;
struct ib_uverbs_reg_mr_resp;
struct ibv_rereg_mr;
struct ib_uverbs_rereg_mr_resp;
struct ibv_alloc_mw;
struct ib_uverbs_alloc_mw_resp;
struct ibv_create_cq;
struct ib_uverbs_create_cq_resp;
struct ibv_create_cq_ex;
struct ib_uverbs_ex_create_cq_resp;
struct ibv_resize_cq;
struct ib_uverbs_resize_cq_resp;
struct ibv_modify_cq;
struct ibv_create_srq;
struct ibv_create_xsrq;
struct ib_uverbs_create_srq_resp;
struct ibv_modify_srq;
struct ibv_query_srq;
struct ibv_create_qp;
struct ibv_create_qp_ex;
struct ib_uverbs_create_qp_resp;
struct ib_uverbs_ex_create_qp_resp;
struct ibv_open_qp;
struct ibv_query_qp;
struct ibv_modify_qp;
struct ibv_modify_qp_ex;
struct ib_uverbs_ex_modify_qp_resp;
struct ibv_query_port;
struct ib_uverbs_create_ah_resp;
struct ibv_create_wq;
struct ib_uverbs_ex_create_wq_resp;
struct ibv_modify_wq;
struct ib_uverbs_ex_create_rwq_ind_table_resp;

namespace {

// The failure of a function that reports errors as an errno value.
int NotSupported() {
  errno = EOPNOTSUPP;
  return EOPNOTSUPP;
}

template <typename T>
T *NoObject() {
  errno = EOPNOTSUPP;
  return nullptr;
}

}  // namespace

extern "C" {

// rdma-core: lets a destroy verb succeed after the device was disassociated (hot-unplug). libmlx5 reads it.
bool verbs_allow_disassociate_destroy = false;

// --- provider registration and context set-up ---
void verbs_register_driver_34(const struct verbs_device_ops *ops) {}

void *_verbs_init_and_alloc_context(struct ibv_device *device, int cmd_fd, size_t alloc_size,
                                    struct verbs_context *context_offset, uint32_t driver_id) {
  return NoObject<void>();
}

void verbs_uninit_context(struct verbs_context *context) {}

void verbs_set_ops(struct verbs_context *vctx, const struct verbs_context_ops *ops) {}

void verbs_init_cq(struct ibv_cq *cq, struct ibv_context *context, struct ibv_comp_channel *channel,
                   void *cq_context) {}

struct ibv_context *verbs_open_device(struct ibv_device *device, void *private_data) {
  return NoObject<struct ibv_context>();
}

void __verbs_log(struct verbs_context *ctx, uint32_t level, const char *fmt, ...) {}

int ibv_read_ibdev_sysfs_file(char *buf, size_t size, struct verbs_sysfs_dev *sysfs_dev, const char *fnfmt, ...) {
  errno = EOPNOTSUPP;
  return -1;  // rdma-core: bytes read, or -1 with errno
}

// --- the ioctl command channel ---
// Number of attributes of a command buffer chain; without the chain's layout we count only the first buffer's.
unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, struct ibv_command_buffer *link) { return num_attrs; }

int execute_ioctl(struct ibv_context *context, struct ibv_command_buffer *cmd) { return NotSupported(); }

// --- kernel command wrappers, alphabetical as in the version script ---
int ibv_cmd_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags, struct ibv_sge *sg_list,
                      uint32_t num_sge) {
  return NotSupported();
}

int ibv_cmd_alloc_dm(struct ibv_context *ctx, const struct ibv_alloc_dm_attr *dm_attr, struct verbs_dm *dm,
                     struct ibv_command_buffer *link) {
  return NotSupported();
}

int ibv_cmd_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type, struct ibv_mw *mw, struct ibv_alloc_mw *cmd,
                     size_t cmd_size, struct ib_uverbs_alloc_mw_resp *resp, size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_alloc_pd(struct ibv_context *context, struct ibv_pd *pd, struct ibv_alloc_pd *cmd, size_t cmd_size,
                     struct ib_uverbs_alloc_pd_resp *resp, size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid) { return NotSupported(); }

int ibv_cmd_close_xrcd(struct verbs_xrcd *xrcd) { return NotSupported(); }

int ibv_cmd_create_ah(struct ibv_pd *pd, struct ibv_ah *ah, struct ibv_ah_attr *attr,
                      struct ib_uverbs_create_ah_resp *resp, size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_create_counters(struct ibv_context *context, struct ibv_counters_init_attr *init_attr,
                            struct verbs_counters *vcounters, struct ibv_command_buffer *link) {
  return NotSupported();
}

int ibv_cmd_create_cq(struct ibv_context *context, int cqe, struct ibv_comp_channel *channel, int comp_vector,
                      struct ibv_cq *cq, struct ibv_create_cq *cmd, size_t cmd_size,
                      struct ib_uverbs_create_cq_resp *resp, size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_create_cq_ex(struct ibv_context *context, const struct ibv_cq_init_attr_ex *cq_attr, struct verbs_cq *cq,
                         struct ibv_create_cq_ex *cmd, size_t cmd_size, struct ib_uverbs_ex_create_cq_resp *resp,
                         size_t resp_size, uint32_t cmd_flags) {
  return NotSupported();
}

int ibv_cmd_create_flow(struct ibv_qp *qp, struct ibv_flow *flow_id, struct ibv_flow_attr *flow_attr, void *ucmd,
                        size_t ucmd_size) {
  return NotSupported();
}

int ibv_cmd_create_flow_action_esp(struct ibv_context *ctx, struct ibv_flow_action_esp_attr *attr,
                                   struct verbs_flow_action *flow_action, struct ibv_command_buffer *driver) {
  return NotSupported();
}

int ibv_cmd_create_qp(struct ibv_pd *pd, struct ibv_qp *qp, struct ibv_qp_init_attr *attr, struct ibv_create_qp *cmd,
                      size_t cmd_size, struct ib_uverbs_create_qp_resp *resp, size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_create_qp_ex(struct ibv_context *context, struct verbs_qp *qp, struct ibv_qp_init_attr_ex *attr_ex,
                         struct ibv_create_qp *cmd, size_t cmd_size, struct ib_uverbs_create_qp_resp *resp,
                         size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_create_qp_ex2(struct ibv_context *context, struct verbs_qp *qp, struct ibv_qp_init_attr_ex *qp_attr,
                          struct ibv_create_qp_ex *cmd, size_t cmd_size, struct ib_uverbs_ex_create_qp_resp *resp,
                          size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_create_rwq_ind_table(struct ibv_context *context, struct ibv_rwq_ind_table_init_attr *init_attr,
                                 struct ibv_rwq_ind_table *rwq_ind_table,
                                 struct ib_uverbs_ex_create_rwq_ind_table_resp *resp, size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_create_srq(struct ibv_pd *pd, struct ibv_srq *srq, struct ibv_srq_init_attr *attr,
                       struct ibv_create_srq *cmd, size_t cmd_size, struct ib_uverbs_create_srq_resp *resp,
                       size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_create_srq_ex(struct ibv_context *context, struct verbs_srq *srq, struct ibv_srq_init_attr_ex *attr_ex,
                          struct ibv_create_xsrq *cmd, size_t cmd_size, struct ib_uverbs_create_srq_resp *resp,
                          size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_create_wq(struct ibv_context *context, struct ibv_wq_init_attr *wq_init_attr, struct ibv_wq *wq,
                      struct ibv_create_wq *cmd, size_t cmd_size, struct ib_uverbs_ex_create_wq_resp *resp,
                      size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_dealloc_mw(struct ibv_mw *mw) { return NotSupported(); }

int ibv_cmd_dealloc_pd(struct ibv_pd *pd) { return NotSupported(); }

int ibv_cmd_dereg_mr(struct verbs_mr *vmr) { return NotSupported(); }

int ibv_cmd_destroy_ah(struct ibv_ah *ah) { return NotSupported(); }

int ibv_cmd_destroy_counters(struct verbs_counters *vcounters) { return NotSupported(); }

int ibv_cmd_destroy_cq(struct ibv_cq *cq) { return NotSupported(); }

int ibv_cmd_destroy_flow(struct ibv_flow *flow_id) { return NotSupported(); }

int ibv_cmd_destroy_flow_action(struct verbs_flow_action *action) { return NotSupported(); }

int ibv_cmd_destroy_qp(struct ibv_qp *qp) { return NotSupported(); }

int ibv_cmd_destroy_rwq_ind_table(struct ibv_rwq_ind_table *rwq_ind_table) { return NotSupported(); }

int ibv_cmd_destroy_srq(struct ibv_srq *srq) { return NotSupported(); }

int ibv_cmd_destroy_wq(struct ibv_wq *wq) { return NotSupported(); }

int ibv_cmd_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid) { return NotSupported(); }

int ibv_cmd_free_dm(struct verbs_dm *dm) { return NotSupported(); }

int ibv_cmd_get_context(struct verbs_context *context, struct ibv_get_context *cmd, size_t cmd_size,
                        struct ib_uverbs_get_context_resp *resp, size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_modify_cq(struct ibv_cq *cq, struct ibv_modify_cq_attr *attr, struct ibv_modify_cq *cmd,
                      size_t cmd_size) {
  return NotSupported();
}

int ibv_cmd_modify_flow_action_esp(struct verbs_flow_action *flow_action, struct ibv_flow_action_esp_attr *attr,
                                   struct ibv_command_buffer *driver) {
  return NotSupported();
}

int ibv_cmd_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_modify_qp *cmd,
                      size_t cmd_size) {
  return NotSupported();
}

int ibv_cmd_modify_qp_ex(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_modify_qp_ex *cmd,
                         size_t cmd_size, struct ib_uverbs_ex_modify_qp_resp *resp, size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask,
                       struct ibv_modify_srq *cmd, size_t cmd_size) {
  return NotSupported();
}

int ibv_cmd_modify_wq(struct ibv_wq *wq, struct ibv_wq_attr *attr, struct ibv_modify_wq *cmd, size_t cmd_size) {
  return NotSupported();
}

int ibv_cmd_open_qp(struct ibv_context *context, struct verbs_qp *qp, int vqp_sz, struct ibv_qp_open_attr *attr,
                    struct ibv_open_qp *cmd, size_t cmd_size, struct ib_uverbs_create_qp_resp *resp,
                    size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_open_xrcd(struct ibv_context *context, struct verbs_xrcd *xrcd, int vxrcd_size,
                      struct ibv_xrcd_init_attr *attr, struct ibv_open_xrcd *cmd, size_t cmd_size,
                      struct ib_uverbs_open_xrcd_resp *resp, size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_poll_cq(struct ibv_cq *cq, int ne, struct ibv_wc *wc) { return NotSupported(); }

int ibv_cmd_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) {
  return NotSupported();
}

int ibv_cmd_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr) {
  return NotSupported();
}

int ibv_cmd_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) {
  return NotSupported();
}

int ibv_cmd_query_context(struct ibv_context *ctx, struct ibv_command_buffer *driver) { return NotSupported(); }

int ibv_cmd_query_device_any(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
                             struct ibv_device_attr_ex *attr, size_t attr_size,
                             struct ib_uverbs_ex_query_device_resp *resp, size_t *resp_size) {
  return NotSupported();
}

int ibv_cmd_query_mr(struct ibv_pd *pd, struct verbs_mr *vmr, uint32_t mr_handle) { return NotSupported(); }

int ibv_cmd_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr,
                       struct ibv_query_port *cmd, size_t cmd_size) {
  return NotSupported();
}

int ibv_cmd_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *qp_attr, int attr_mask,
                     struct ibv_qp_init_attr *qp_init_attr, struct ibv_query_qp *cmd, size_t cmd_size) {
  return NotSupported();
}

int ibv_cmd_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr, struct ibv_query_srq *cmd,
                      size_t cmd_size) {
  return NotSupported();
}

int ibv_cmd_read_counters(struct verbs_counters *vcounters, uint64_t *counters_value, uint32_t ncounters,
                          uint32_t flags, struct ibv_command_buffer *link) {
  return NotSupported();
}

int ibv_cmd_reg_dm_mr(struct ibv_pd *pd, struct verbs_dm *dm, uint64_t offset, size_t length, unsigned int access,
                      struct verbs_mr *vmr, struct ibv_command_buffer *link) {
  return NotSupported();
}

int ibv_cmd_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access,
                          struct verbs_mr *vmr) {
  return NotSupported();
}

int ibv_cmd_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access, struct verbs_mr *vmr,
                   struct ibv_reg_mr *cmd, size_t cmd_size, struct ib_uverbs_reg_mr_resp *resp, size_t resp_size) {
  return NotSupported();
}

int ibv_cmd_req_notify_cq(struct ibv_cq *cq, int solicited_only) { return NotSupported(); }

int ibv_cmd_rereg_mr(struct verbs_mr *vmr, uint32_t flags, void *addr, size_t length, uint64_t hca_va, int access,
                     struct ibv_pd *pd, struct ibv_rereg_mr *cmd, size_t cmd_sz, struct ib_uverbs_rereg_mr_resp *resp,
                     size_t resp_sz) {
  return NotSupported();
}

int ibv_cmd_resize_cq(struct ibv_cq *cq, int cqe, struct ibv_resize_cq *cmd, size_t cmd_size,
                      struct ib_uverbs_resize_cq_resp *resp, size_t resp_size) {
  return NotSupported();
}

}  // extern "C"
