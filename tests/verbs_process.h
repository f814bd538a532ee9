// What the multi-process verbs checks (tests/direct_access_check.cc, tests/xrc_share_check.cc,
// tests/import_share_check.cc) share: dying with a message, whole reads and writes on the socket to another process of
// the check, opening the first device with a PD, a CQ and GID 0, connecting an RC QP, waiting for a completion. Each
// check runs under `uroce run --host-device`, every process opening the device after fork.
#pragma once

#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace uroce::checks {

// The check's name, for its messages ("direct_access_check").
inline const char* program = "check";

[[noreturn]] inline void Die(const char* what) {
  fprintf(stderr, "%s[%d]: %s: %s\n", program, getpid(), what, strerror(errno));
  exit(2);
}

inline void SendAll(int fd, const void* p, size_t n) {
  if (write(fd, p, n) != ssize_t(n)) Die("write to the other process");
}
inline void ReceiveAll(int fd, void* p, size_t n) {
  if (read(fd, p, n) != ssize_t(n)) Die("read from the other process");
}
template <typename T>
void Put(int fd, const T& v) {
  SendAll(fd, &v, sizeof v);
}
template <typename T>
T Get(int fd) {
  T v;
  ReceiveAll(fd, &v, sizeof v);
  return v;
}

struct Device {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_gid gid{};
};

// The first device, a PD, a CQ of `cq_entries` and GID 0 of port 1 (every process of one host device has the same).
inline Device OpenFirstDevice(int cq_entries) {
  Device d;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) Die("no RDMA device");
  d.ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (d.ctx == nullptr) Die("ibv_open_device");
  d.pd = ibv_alloc_pd(d.ctx);
  d.cq = ibv_create_cq(d.ctx, cq_entries, nullptr, nullptr, 0);
  if (d.pd == nullptr || d.cq == nullptr) Die("ibv_alloc_pd / ibv_create_cq");
  if (ibv_query_gid(d.ctx, 1, 0, &d.gid) != 0) Die("ibv_query_gid");
  return d;
}

// RESET -> INIT -> RTR -> RTS towards `peer_qpn` at our own GID (one host device), with `access` as the QP's remote
// access flags. Short timeouts: a target in error costs (retry_cnt + 1) x 4 ms.
inline void ConnectRc(Device& d, ibv_qp* qp, uint32_t peer_qpn, int access) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = access;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) Die("to INIT");
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = peer_qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 4;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = d.gid;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    Die("to RTR");
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 10;
  a.retry_cnt = 1;
  a.rnr_retry = 1;
  a.sq_psn = 0;
  a.max_rd_atomic = 4;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                        IBV_QP_MAX_QP_RD_ATOMIC))
    Die("to RTS");
}

// Waits up to `seconds` for one completion: false when none came.
inline bool PollOne(ibv_cq* cq, ibv_wc* wc, int seconds) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < give_up) {
    const int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0) Die("ibv_poll_cq");
    if (n == 1) return true;
  }
  return false;
}

}  // namespace uroce::checks
