// What the multi-process verbs checks (tests/direct_access_check.cc, tests/xrc_share_check.cc) share: dying with a
// message, whole reads and writes on the socket to another process of the check, and opening the first device with a
// PD, a CQ and GID 0. Each check runs under `uroce run --host-device`, every process opening the device after fork.
#pragma once

#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
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

}  // namespace uroce::checks
