// On-demand paging hints and device memory. Memory a software HCA serves better than rxe: every MR is already
// "on demand" (nothing is pinned), and device memory is host memory the device owns.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "verbs_api/internal.h"
#include "verbs_api/verbs_table.h"

using namespace uroce;
using namespace uroce::verbs;

namespace {

// Device memory: a host buffer behind struct ibv_dm (ibv_alloc_dm(3)).
struct Dm {
  ibv_dm dm;
  uint8_t* bytes;
  size_t length;
};
Dm* ToDm(ibv_dm* d) { return reinterpret_cast<Dm*>(d); }

int MemcpyToDm(ibv_dm* dm, uint64_t offset, const void* host, size_t length) {
  Dm* d = ToDm(dm);
  if (offset > d->length || length > d->length - offset) return EINVAL;
  std::memcpy(d->bytes + offset, host, length);
  return 0;
}

int MemcpyFromDm(void* host, ibv_dm* dm, uint64_t offset, size_t length) {
  Dm* d = ToDm(dm);
  if (offset > d->length || length > d->length - offset) return EINVAL;
  std::memcpy(host, d->bytes + offset, length);
  return 0;
}

ibv_dm* AllocDm(ibv_context* context, ibv_alloc_dm_attr* attr) {
  if (attr->comp_mask != 0 || attr->length == 0 || attr->log_align_req > 12) {
    errno = EINVAL;
    return nullptr;
  }
  if (attr->length > kMaxDmBytes) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* d = new Dm{};
  // Page alignment satisfies any log_align_req up to 12.
  d->bytes = static_cast<uint8_t*>(std::aligned_alloc(4096, (attr->length + 4095) & ~size_t{4095}));
  if (d->bytes == nullptr) {
    delete d;
    errno = ENOMEM;
    return nullptr;
  }
  std::memset(d->bytes, 0, attr->length);
  d->length = attr->length;
  d->dm.context = context;
  d->dm.memcpy_to_dm = MemcpyToDm;
  d->dm.memcpy_from_dm = MemcpyFromDm;
  return &d->dm;
}

int FreeDm(ibv_dm* dm) {
  Dm* d = ToDm(dm);
  std::free(d->bytes);
  delete d;
  return 0;
}

ibv_mr* RegDmMr(ibv_pd* pd, ibv_dm* dm, uint64_t offset, size_t length, unsigned int access) {
  Dm* d = ToDm(dm);
  // ibv_reg_dm_mr(3): device memory is addressed zero-based and cannot be on demand.
  if (!(access & IBV_ACCESS_ZERO_BASED) || (access & IBV_ACCESS_ON_DEMAND) || offset > d->length ||
      length > d->length - offset) {
    errno = EINVAL;
    return nullptr;
  }
  return RegisterMemory(pd, d->bytes + offset, length, 0, access);
}

// ibv_advise_mr(3): a prefetch of on-demand memory. Nothing is ever paged out here, so the advice only validates.
int AdviseMr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge) {
  if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
      advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
    return EOPNOTSUPP;
  if (flags & ~uint32_t(IBV_ADVISE_MR_FLAG_FLUSH)) return EINVAL;
  if (num_sge == 0 || sg_list == nullptr) return EINVAL;
  emu::Device& dev = ToContext(pd->context)->dev();
  for (uint32_t i = 0; i < num_sge; ++i) {
    emu::MemoryRegion mr;
    if (dev.QueryMr(sg_list[i].lkey, &mr) != 0 || mr.pd != ToPd(pd)->emu) return EINVAL;
    if (!mr.Translate(sg_list[i].addr, sg_list[i].length)) return EFAULT;
  }
  return 0;
}

}  // namespace

namespace uroce::verbs {

void FillMemoryOps(verbs_context* v) {
  v->alloc_dm = AllocDm;
  v->free_dm = FreeDm;
  v->reg_dm_mr = RegDmMr;
  v->advise_mr = AdviseMr;
}

}  // namespace uroce::verbs

extern "C" {

// Data of one message lands in PSN order: the responder places each packet as it accepts it in sequence.
int ibv_query_qp_data_in_order(ibv_qp* qp, ibv_wr_opcode op, uint32_t flags) {
  if (qp == nullptr) return 0;
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_SEND_WITH_INV:
    case IBV_WR_RDMA_READ:
      return flags ? 0 : 1;  // flags must be 0 (verbs.h)
    default:
      return 0;
  }
}

}  // extern "C"
