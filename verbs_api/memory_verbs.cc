// On-demand paging hints and device memory. Memory a software HCA serves better than rxe: every MR is already
// "on demand" (nothing is pinned), and device memory is host memory the device owns.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "verbs_api/internal.h"
#include "verbs_api/verbs_table.h"

using namespace uroce;
using namespace uroce::verbs;

namespace {

// Device memory: a host buffer behind struct ibv_dm (ibv_alloc_dm(3)), shared by the ibv_dm that allocated it and
// those that imported it by handle (ibv_import_dm(3)).
struct DmMemory {
  uint8_t* bytes = nullptr;
  size_t length = 0;
  ~DmMemory() { std::free(bytes); }
};
struct Dm {
  ibv_dm dm;
  std::shared_ptr<DmMemory> memory;
};
Dm* ToDm(ibv_dm* d) { return reinterpret_cast<Dm*>(d); }

// The live device memory of this process's device by handle, for ibv_import_dm. A handle is never reused.
struct DmTable {
  std::mutex mu;
  std::unordered_map<uint32_t, std::shared_ptr<DmMemory>> by_handle;
  uint32_t next_handle = 1;
};
DmTable& Dms() {
  static DmTable* table = new DmTable;  // never destroyed: a DM may be freed from an atexit handler
  return *table;
}

// Device memory is copied in 4-byte units (mlx5's MEMIC, the device memory rdma-core's tests are written for, refuses
// anything else): an offset or length that is not a multiple of 4, or a range beyond the allocation, is EINVAL.
constexpr uint64_t kDmCopyUnit = 4;
bool DmRangeOk(const DmMemory& m, uint64_t offset, size_t length) {
  return offset % kDmCopyUnit == 0 && length % kDmCopyUnit == 0 && offset <= m.length && length <= m.length - offset;
}

int MemcpyToDm(ibv_dm* dm, uint64_t offset, const void* host, size_t length) {
  DmMemory& m = *ToDm(dm)->memory;
  if (!DmRangeOk(m, offset, length)) return EINVAL;
  std::memcpy(m.bytes + offset, host, length);
  return 0;
}

int MemcpyFromDm(void* host, ibv_dm* dm, uint64_t offset, size_t length) {
  DmMemory& m = *ToDm(dm)->memory;
  if (!DmRangeOk(m, offset, length)) return EINVAL;
  std::memcpy(host, m.bytes + offset, length);
  return 0;
}

ibv_dm* NewDmHandle(ibv_context* context, uint32_t handle, std::shared_ptr<DmMemory> memory) {
  auto* d = new Dm{};
  d->memory = std::move(memory);
  d->dm.context = context;
  d->dm.memcpy_to_dm = MemcpyToDm;
  d->dm.memcpy_from_dm = MemcpyFromDm;
  d->dm.handle = handle;
  return &d->dm;
}

static ibv_dm* AllocDmUnguarded(ibv_context* context, ibv_alloc_dm_attr* attr) {
  if (attr->comp_mask != 0 || attr->length == 0 || attr->log_align_req > 12) {
    errno = EINVAL;
    return nullptr;
  }
  if (attr->length > kMaxDmBytes) {
    errno = ENOMEM;
    return nullptr;
  }
  auto memory = std::make_shared<DmMemory>();
  // Page alignment satisfies any log_align_req up to 12.
  memory->bytes = static_cast<uint8_t*>(std::aligned_alloc(4096, (attr->length + 4095) & ~size_t{4095}));
  if (memory->bytes == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  std::memset(memory->bytes, 0, attr->length);
  memory->length = attr->length;
  DmTable& t = Dms();
  std::lock_guard lock(t.mu);
  const uint32_t handle = t.next_handle++;
  t.by_handle[handle] = memory;
  return NewDmHandle(context, handle, std::move(memory));
}

ibv_dm* AllocDm(ibv_context* context, ibv_alloc_dm_attr* attr) {
  return NoThrow<ibv_dm*>(nullptr, [&] { return AllocDmUnguarded(context, attr); });
}

// ibv_free_dm(3) through any handle destroys the device memory for all: it can no longer be imported. Handles still
// imported keep the bytes alive until they are unimported, so a late access is never a use after free.
int FreeDm(ibv_dm* dm) {
  Dm* d = ToDm(dm);
  {
    DmTable& t = Dms();
    std::lock_guard lock(t.mu);
    auto it = t.by_handle.find(dm->handle);
    if (it != t.by_handle.end() && it->second == d->memory) t.by_handle.erase(it);
  }
  delete d;
  return 0;
}

ibv_mr* RegDmMr(ibv_pd* pd, ibv_dm* dm, uint64_t offset, size_t length, unsigned int access) {
  DmMemory& m = *ToDm(dm)->memory;
  // ibv_reg_dm_mr(3): device memory is addressed zero-based and cannot be on demand.
  if (!(access & IBV_ACCESS_ZERO_BASED) || (access & IBV_ACCESS_ON_DEMAND) || offset > m.length ||
      length > m.length - offset) {
    errno = EINVAL;
    return nullptr;
  }
  return RegisterMemory(pd, m.bytes + offset, length, 0, access);
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

// ibv_import_dm(3): another handle on device memory allocated through any context of this process. Through a context
// of another process's cmd_fd the handle names that process's device memory, which is not shared: EOPNOTSUPP.
ibv_dm* ibv_import_dm(ibv_context* context, uint32_t dm_handle) {
  if (Ctx(context)->imported_owner != 0) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  std::shared_ptr<DmMemory> memory;
  {
    DmTable& t = Dms();
    std::lock_guard lock(t.mu);
    auto it = t.by_handle.find(dm_handle);
    if (it != t.by_handle.end()) memory = it->second;
  }
  if (!memory) {
    errno = EINVAL;
    return nullptr;
  }
  return NewDmHandle(context, dm_handle, std::move(memory));
}

// ibv_unimport_dm(3): forgets the handle without freeing the device memory.
void ibv_unimport_dm(ibv_dm* dm) { delete ToDm(dm); }

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
