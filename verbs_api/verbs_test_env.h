// Shared set-up of the verbs-level tests: the process's uroce0 opened through the public API, a PD, and the port's
// GID (the address its engine bound). Tests in one process talk to themselves over the real io_uring transport.
#pragma once

#include <infiniband/verbs.h>

namespace uroce::verbs::testing {

struct VerbsEnv {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_gid gid{};

  VerbsEnv() {
    ibv_device** list = ibv_get_device_list(nullptr);
    ctx = list && list[0] ? ibv_open_device(list[0]) : nullptr;
    if (list) ibv_free_device_list(list);
    if (ctx == nullptr) return;
    pd = ibv_alloc_pd(ctx);
    ibv_query_gid(ctx, 1, 0, &gid);
  }
  ~VerbsEnv() {
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
  VerbsEnv(const VerbsEnv&) = delete;
  VerbsEnv& operator=(const VerbsEnv&) = delete;
};

}  // namespace uroce::verbs::testing
