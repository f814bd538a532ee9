// Protection domains, memory regions, completion queues and channels, address handles, async events.
#include <infiniband/verbs.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "verbs_api/internal.h"
#include "verbs_api/verbs_table.h"
#include "wire/clock.h"

using namespace uroce;
using namespace uroce::verbs;

namespace {

// ibv_get_async_event hands `e` out: it counts for its object (internal.h, Cq::async_events_reported).
void CountReported(const ibv_async_event& e) {
  switch (ElementOf(e.event_type)) {
    case EventElement::kCq:
      ++ToCq(e.element.cq)->async_events_reported;
      break;
    case EventElement::kQp:
      ++ToQp(e.element.qp)->events_reported;
      break;
    case EventElement::kSrq:
      ++ToSrq(e.element.srq)->events_reported;
      break;
    case EventElement::kPort:
      break;
  }
}

// A thread found `cq` empty. When applications hold the receive side (verbs_api/engine.h) it receives and processes
// what is queued itself; otherwise it gives the CPU away once, because the progress thread that would fill the CQ
// may be waiting for it (2 cores, several spinning threads). Returns the datagrams it processed; the caller looks at
// the CQ again either way.
int DriveOnEmptyCq(Cq* cq) {
  Engine& engine = *Ctx(cq->cqx.context)->engine;
  const int n = engine.DriveFromApplication();
  if (n < 0) {
    // The time given away is ours, not a pause in the application's polling; nor is it the library at work.
    Engine::VerbTimer timer(engine, /*keeps_lease=*/false);
    sched_yield();
  }
  return n;
}

constexpr uint64_t kSupportedWcFlags =
    IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |
    IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

void ToWc(const emu::Completion& c, ibv_wc* wc) {
  wc->wr_id = c.wr_id;
  wc->status = static_cast<ibv_wc_status>(c.status);
  wc->opcode = static_cast<ibv_wc_opcode>(c.opcode);
  wc->vendor_err = c.vendor_err;
  wc->byte_len = c.byte_len;
  wc->imm_data = c.imm_data;
  wc->qp_num = c.qp_num;
  wc->src_qp = c.src_qp;
  wc->wc_flags = c.wc_flags;
  wc->pkey_index = c.pkey_index;
  wc->slid = c.slid;
  wc->sl = c.sl;
  wc->dlid_path_bits = c.dlid_path_bits;
}

// --- ibv_cq_ex polling: one current entry at a time ---
int CqStartPoll(ibv_cq_ex* cqx, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask) return EINVAL;
  Cq* cq = ToCq(cqx);
  auto take = [cq] { return !cq->emu->Empty() && cq->emu->Poll(&cq->current, 1) == 1; };
  if (!take()) {
    DriveOnEmptyCq(cq);  // and looked at again whatever it did, as PollCq
    if (!take()) return ENOENT;
  }
  Ctx(cqx->context)->engine->NoteCompletion();
  cqx->wr_id = cq->current.wr_id;
  cqx->status = static_cast<ibv_wc_status>(cq->current.status);
  return 0;
}
int CqNextPoll(ibv_cq_ex* cqx) {
  Cq* cq = ToCq(cqx);
  if (cq->emu->Poll(&cq->current, 1) == 0) return ENOENT;
  cqx->wr_id = cq->current.wr_id;
  cqx->status = static_cast<ibv_wc_status>(cq->current.status);
  return 0;
}
void CqEndPoll(ibv_cq_ex*) {}
ibv_wc_opcode CqReadOpcode(ibv_cq_ex* c) { return static_cast<ibv_wc_opcode>(ToCq(c)->current.opcode); }
uint32_t CqReadVendorErr(ibv_cq_ex* c) { return ToCq(c)->current.vendor_err; }
uint32_t CqReadByteLen(ibv_cq_ex* c) { return ToCq(c)->current.byte_len; }
__be32 CqReadImmData(ibv_cq_ex* c) { return ToCq(c)->current.imm_data; }
uint32_t CqReadQpNum(ibv_cq_ex* c) { return ToCq(c)->current.qp_num; }
uint32_t CqReadSrcQp(ibv_cq_ex* c) { return ToCq(c)->current.src_qp; }
unsigned int CqReadWcFlags(ibv_cq_ex* c) { return ToCq(c)->current.wc_flags; }
uint32_t CqReadSlid(ibv_cq_ex* c) { return ToCq(c)->current.slid; }
uint8_t CqReadSl(ibv_cq_ex* c) { return ToCq(c)->current.sl; }
uint8_t CqReadDlidPathBits(ibv_cq_ex* c) { return ToCq(c)->current.dlid_path_bits; }
// The HCA clock counts nanoseconds (query_device_ex reports hca_core_clock = 1 GHz).
uint64_t CqReadCompletionTs(ibv_cq_ex* c) { return ToCq(c)->current.timestamp_ns; }
uint64_t CqReadCompletionWallclockNs(ibv_cq_ex* c) {
  timespec mono{}, real{};
  clock_gettime(CLOCK_MONOTONIC, &mono);
  clock_gettime(CLOCK_REALTIME, &real);
  const uint64_t mono_ns = uint64_t(mono.tv_sec) * 1'000'000'000 + mono.tv_nsec;
  const uint64_t real_ns = uint64_t(real.tv_sec) * 1'000'000'000 + real.tv_nsec;
  return real_ns - (mono_ns - ToCq(c)->current.timestamp_ns);
}

ibv_cq_ex* NewCq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, uint64_t wc_flags) {
  if (cqe <= 0) return Fail<ibv_cq_ex>(EINVAL);
  if (wc_flags & ~kSupportedWcFlags) return Fail<ibv_cq_ex>(EOPNOTSUPP);
  emu::CompletionQueue* ecq = nullptr;
  if (int err = Ctx(context)->dev().CreateCq(static_cast<uint32_t>(cqe), &ecq)) return Fail<ibv_cq_ex>(err);
  auto* cq = static_cast<Cq*>(calloc(1, sizeof(Cq)));
  cq->emu = ecq;
  ecq->timestamps =
      (wc_flags & (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)) != 0;
  cq->wc_flags = wc_flags;
  ibv_cq_ex& x = cq->cqx;
  x.context = context;
  x.channel = channel;
  x.cq_context = cq_context;
  x.handle = ecq->handle();
  x.cqe = cqe;
  pthread_mutex_init(&x.mutex, nullptr);
  pthread_cond_init(&x.cond, nullptr);
  x.start_poll = CqStartPoll;
  x.next_poll = CqNextPoll;
  x.end_poll = CqEndPoll;
  x.read_opcode = CqReadOpcode;
  x.read_vendor_err = CqReadVendorErr;
  x.read_byte_len = CqReadByteLen;
  x.read_imm_data = CqReadImmData;
  x.read_qp_num = CqReadQpNum;
  x.read_src_qp = CqReadSrcQp;
  x.read_wc_flags = CqReadWcFlags;
  x.read_slid = CqReadSlid;
  x.read_sl = CqReadSl;
  x.read_dlid_path_bits = CqReadDlidPathBits;
  x.read_completion_ts = CqReadCompletionTs;
  x.read_completion_wallclock_ns = CqReadCompletionWallclockNs;
  ibv_cq* base = ibv_cq_ex_to_cq(&x);
  ecq->owner = base;
  if (channel) {
    CompChannel* ch = ToChannel(channel);
    __atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_RELAXED);
    ecq->set_notifier([ch, base](emu::CompletionQueue&) { ch->events.Push(base); });
  }
  return &x;
}

}  // namespace

namespace uroce::verbs {

// Takes up to `max` completions of `q` into `wc`; returns how many.
int TakeCompletions(emu::CompletionQueue& q, int max, ibv_wc* wc) {
  emu::Completion batch[32];
  int done = 0;
  while (done < max) {
    const int want = std::min<int>(max - done, 32);
    const int n = q.Poll(batch, want);
    for (int i = 0; i < n; ++i) ToWc(batch[i], &wc[done + i]);
    done += n;
    if (n < want) break;
  }
  return done;
}

int PollCq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  if (num_entries < 0) return -EINVAL;
  emu::CompletionQueue& q = *ToCq(cq)->emu;
  // The drive's readings of the clock also time the completions it finds (wire::ClockBatch).
  const wire::ClockBatch batch;
  // An empty CQ is looked at without its lock: polling it is the application's hot loop.
  int done = q.Empty() ? 0 : TakeCompletions(q, num_entries, wc);
  // Up to two drives while the first finds datagrams but no completion yet. The CQ is looked at after each, whatever
  // it did: an empty answer must mean the CQ was empty when the call ended. While this thread gave its CPU away, the
  // progress thread may have completed work and then delivered an rdma_cm event that arrived after it; ofi_rxm reads
  // its CQ until it is empty and only then its event queue, and so read a DISCONNECTED before the completion of the
  // last message it was owed (fi_pingpong -e rdm: a flushed WR).
  for (int drives = 0; done == 0 && num_entries > 0 && drives < 2; ++drives) {
    const int found = DriveOnEmptyCq(ToCq(cq));
    if (!q.Empty()) done = TakeCompletions(q, num_entries, wc);
    if (found <= 0) break;
  }
  if (done > 0) Ctx(cq->context)->engine->NoteCompletion();
  return done;
}

int ReqNotifyCq(ibv_cq* cq, int solicited_only) {
  Ctx(cq->context)->engine->ApplicationSleeps();  // about to wait for an event: the progress thread must receive
  return ToCq(cq)->emu->RequestNotify(solicited_only != 0);
}

static ibv_cq_ex* CreateCqExUnguarded(ibv_context* context, ibv_cq_init_attr_ex* a) {
  if (a->comp_mask & ~uint32_t(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD))
    return Fail<ibv_cq_ex>(EINVAL);
  if ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
      (a->flags & ~uint32_t(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)))
    return Fail<ibv_cq_ex>(EOPNOTSUPP);
  if (a->comp_vector != 0) return Fail<ibv_cq_ex>(EINVAL);  // num_comp_vectors is 1
  // IBV_CQ_INIT_ATTR_MASK_PD names the parent domain whose allocators the CQ would use (ibv_create_cq_ex(3)): it must
  // be a parent domain of this context.
  if ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) &&
      (a->parent_domain == nullptr || ToPd(a->parent_domain)->extends == nullptr ||
       a->parent_domain->context != context))
    return Fail<ibv_cq_ex>(EINVAL);
  return NewCq(context, static_cast<int>(a->cqe), a->cq_context, a->channel, a->wc_flags);
}

ibv_cq_ex* CreateCqEx(ibv_context* context, ibv_cq_init_attr_ex* a) {
  return NoThrow<ibv_cq_ex*>(nullptr, [&] { return CreateCqExUnguarded(context, a); });
}

// ibv_alloc_parent_domain(3): a PD that stands for attr->pd everywhere. The device keeps every queue in its own
// memory, never in buffers the application provides, so the custom allocators are accepted and never called; there
// are no thread domains (ibv_alloc_td is EOPNOTSUPP), so attr->td must be NULL.
ibv_pd* AllocParentDomain(ibv_context* context, ibv_parent_domain_init_attr* attr) {
  constexpr uint32_t kKnown = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  if (attr == nullptr || attr->pd == nullptr || attr->td != nullptr || (attr->comp_mask & ~kKnown))
    return Fail<ibv_pd>(EINVAL);
  if (attr->pd->context != context) return Fail<ibv_pd>(EINVAL);
  if ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) && (attr->alloc == nullptr || attr->free == nullptr))
    return Fail<ibv_pd>(EINVAL);
  Pd* base = ToPd(attr->pd);
  if (base->extends != nullptr) return Fail<ibv_pd>(EINVAL);  // a parent domain extends a protection domain
  auto* parent = new Pd{{context, base->pd.handle}, base->emu, base};
  base->parent_domains.fetch_add(1);
  return &parent->pd;
}

}  // namespace uroce::verbs

extern "C" {

// --- PD ---
static ibv_pd* AllocPdUnguarded(ibv_context* context) {
  emu::ProtectionDomain* epd = Ctx(context)->dev().AllocPd();
  if (epd == nullptr) return Fail<ibv_pd>(ENOMEM);
  auto* pd = new Pd{{context, epd->handle()}, epd};
  return &pd->pd;
}

ibv_pd* ibv_alloc_pd(ibv_context* context) {
  return NoThrow<ibv_pd*>(nullptr, [&] { return AllocPdUnguarded(context); });
}

int ibv_dealloc_pd(ibv_pd* pd) {
  Pd* p = ToPd(pd);
  // Another process's PD: it is that process's to destroy (ibv_unimport_pd forgets our handle).
  if (p->imported_owner != 0) return EOPNOTSUPP;
  if (p->extends != nullptr) {  // a parent domain: only it goes (ibv_alloc_parent_domain(3))
    p->extends->parent_domains.fetch_sub(1);
    delete p;
    return 0;
  }
  if (p->parent_domains.load() > 0) return EBUSY;
  if (int err = Ctx(pd->context)->dev().DeallocPd(p->emu)) return err;
  delete p;
  return 0;
}

// ibv_import_pd(3): another handle on a PD of this device (created through any context of the process), or, through a
// context of another process's cmd_fd, on a PD of that process: a PD of ours stands for it (the same one for every
// handle on it), in which our QPs and the regions imported from it meet.
ibv_pd* ibv_import_pd(ibv_context* context, uint32_t pd_handle) {
  Context* ctx = Ctx(context);
  if (ctx->imported_owner == 0) {
    emu::ProtectionDomain* epd = ctx->dev().FindPd(pd_handle);
    if (epd == nullptr) return Fail<ibv_pd>(EINVAL);
    return &(new Pd{{context, pd_handle}, epd})->pd;
  }
  const uint8_t owner = ctx->imported_owner;
  if (int rc = ctx->engine->host_transport()->ImportablePd(owner, pd_handle)) return Fail<ibv_pd>(-rc);
  Engine::Imports& imports = ctx->engine->imports();
  std::lock_guard lock(imports.mu);
  auto& [ours, handles] = imports.pds[{owner, pd_handle}];
  if (ours == nullptr && (ours = ctx->dev().AllocPd()) == nullptr) {
    imports.pds.erase({owner, pd_handle});
    return Fail<ibv_pd>(ENOMEM);
  }
  ++handles;
  auto* pd = new Pd{{context, pd_handle}, ours};
  pd->imported_owner = owner;
  return &pd->pd;
}

// ibv_unimport_pd(3): forgets the handle without destroying the PD. The last handle on another process's PD lets the
// PD of ours that stood for it go, unless our objects are still in it.
void ibv_unimport_pd(ibv_pd* pd) {
  Pd* p = ToPd(pd);
  if (p->imported_owner != 0) {
    Context* ctx = Ctx(pd->context);
    Engine::Imports& imports = ctx->engine->imports();
    std::lock_guard lock(imports.mu);
    auto it = imports.pds.find({p->imported_owner, pd->handle});
    if (it != imports.pds.end() && --it->second.second == 0 && ctx->dev().DeallocPd(it->second.first) == 0)
      imports.pds.erase(it);
  }
  delete p;
}

// --- MR ---
static ibv_mr* RegMrIova2Unguarded(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  return RegisterMemory(pd, addr, length, iova, access);
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  return NoThrow<ibv_mr*>(nullptr, [&] { return RegMrIova2Unguarded(pd, addr, length, iova, access); });
}

}  // extern "C"

namespace uroce::verbs {

// Whether a region of `access` may be written by the device (local or remote write, atomics): pinning it asks for
// writable pages.
static bool DeviceWrites(unsigned int access) {
  return access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
}

// Whether [addr, addr + length) is memory this process maps, readable and, when the region's access lets the device
// write it (local or remote write, atomics), writable: what pinning its pages checks in the kernel (ibv_reg_mr(3):
// EFAULT for a range that is not; EINVAL for one that wraps around). An on-demand region is checked at each access
// instead (IBV_ACCESS_ON_DEMAND: nothing is pinned), as every access is (emu/host_memory.h).
static int CheckMapped(const void* addr, size_t length, unsigned int access) {
  if (length == 0 || (access & IBV_ACCESS_ON_DEMAND)) return 0;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(addr);
  if (begin + length < begin) return EINVAL;
  const uintptr_t end = begin + length;
  const bool write = DeviceWrites(access);
  FILE* maps = fopen("/proc/self/maps", "re");
  if (maps == nullptr) return 0;  // cannot tell here; the accesses are guarded all the same
  uintptr_t covered = begin;  // the mappings are listed in address order
  char line[512];
  int err = 0;
  while (covered < end && err == 0 && fgets(line, sizeof line, maps)) {
    unsigned long lo = 0, hi = 0;
    char perms[5] = {};
    if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3 || hi <= covered) continue;
    if (lo > covered) break;  // a hole before the rest of the range
    if (perms[0] != 'r' || (write && perms[1] != 'w')) err = EFAULT;
    covered = hi;
  }
  fclose(maps);
  return err != 0 ? err : covered >= end ? 0 : EFAULT;
}

// Faults in the pages of a range CheckMapped accepted, writable when the device may write it: what pinning them does
// in the kernel (ibv_reg_mr(3) of a real device: ib_umem_get), so that the first accesses of a transfer, local or
// from another process of the host, find them resident. Without it the first pass of ib_write_bw over its buffers
// took a page fault per page on both sides (perftest's 5,000 messages of 64 KiB between two processes of the host
// device, 14 alternating pairs of runs: median 7,840 -> 9,100 MB/s). Not for an on-demand region (nothing is pinned);
// a mapping that cannot be populated (a device's, an old kernel without MADV_POPULATE_*) is left as it is: each access
// is guarded all the same.
static void FaultIn(const void* addr, size_t length, unsigned int access) {
  if (length == 0 || (access & IBV_ACCESS_ON_DEMAND)) return;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(addr) + length;
  (void)madvise(reinterpret_cast<void*>(begin), end - begin,
                DeviceWrites(access) ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
}

ibv_mr* RegisterMemory(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  if (pd == nullptr) return Fail<ibv_mr>(EINVAL);
  if (int err = CheckMapped(addr, length, access)) return Fail<ibv_mr>(err);
  FaultIn(addr, length, access);
  emu::MemoryRegion m;
  if (int err = Ctx(pd->context)->dev().RegisterMr(ToPd(pd)->emu, addr, length, iova, access, &m))
    return Fail<ibv_mr>(err);
  auto* mr = new Mr{};
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.addr = addr;
  mr->mr.length = length;
  mr->mr.handle = m.lkey >> 8;
  mr->mr.lkey = m.lkey;
  mr->mr.rkey = m.rkey;
  return &mr->mr;
}

}  // namespace uroce::verbs

extern "C" {

#undef ibv_reg_mr
ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr), static_cast<unsigned>(access));
}

#undef ibv_reg_mr_iova
ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  // ibv_rereg_mr(3): flags name what changes; the rest stays as it was.
  if (flags & ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS))
    return IBV_REREG_MR_ERR_INPUT;
  if (flags == 0) return IBV_REREG_MR_ERR_INPUT;
  emu::Device& dev = Ctx(mr->context)->dev();
  emu::MemoryRegion cur;
  if (dev.QueryMr(mr->lkey, &cur) != 0) return IBV_REREG_MR_ERR_INPUT;
  ibv_pd* new_pd = (flags & IBV_REREG_MR_CHANGE_PD) ? pd : mr->pd;
  void* new_addr = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? addr : mr->addr;
  size_t new_len = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? length : mr->length;
  const unsigned new_access = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? static_cast<unsigned>(access) : cur.access;
  if (new_pd == nullptr) return IBV_REREG_MR_ERR_INPUT;
  if (CheckMapped(new_addr, new_len, new_access) != 0) return IBV_REREG_MR_ERR_INPUT;
  FaultIn(new_addr, new_len, new_access);
  emu::MemoryRegion m;
  if (dev.ReregisterMr(mr->lkey, ToPd(new_pd)->emu, new_addr, new_len, reinterpret_cast<uintptr_t>(new_addr),
                       new_access, &m) != 0)
    return IBV_REREG_MR_ERR_INPUT;
  mr->pd = new_pd;
  mr->addr = new_addr;
  mr->length = new_len;
  return 0;
}

namespace {

// Another process's registered memory, reached through the host device's cross-memory copies while that process
// still exports the region.
class ImportedMemory final : public emu::ForeignMemory {
 public:
  ImportedMemory(wire::HostDeviceTransport* transport, uint8_t owner, uint32_t lkey)
      : transport_(transport), owner_(owner), lkey_(lkey) {}
  bool Read(uint64_t there, void* into, size_t n) override {
    return transport_->ReadExported(owner_, lkey_, there, into, n);
  }
  bool Write(uint64_t there, const void* from, size_t n) override {
    return transport_->WriteExported(owner_, lkey_, there, from, n);
  }

 private:
  wire::HostDeviceTransport* transport_;
  uint8_t owner_;
  uint32_t lkey_;
};

// ibv_import_mr of another process's region, through a PD imported from it.
ibv_mr* ImportForeignMr(ibv_pd* pd, uint32_t mr_handle) {
  Context* ctx = Ctx(pd->context);
  const uint8_t owner = ToPd(pd)->imported_owner;
  wire::HostDeviceTransport* transport = ctx->engine->host_transport();
  wire::ExportedRegion r;
  if (int rc = transport->ImportableRegion(owner, mr_handle, &r)) return Fail<ibv_mr>(-rc);
  if (r.pd != pd->handle) return Fail<ibv_mr>(EINVAL);  // the MR belongs to another PD
  Engine::Imports& imports = ctx->engine->imports();
  std::lock_guard lock(imports.mu);
  int& handles = imports.regions[r.lkey];
  if (handles == 0) {
    emu::MemoryRegion m;
    m.host = reinterpret_cast<uint8_t*>(r.host);
    m.iova = r.iova;
    m.length = r.length;
    m.access = r.access;
    m.lkey = m.rkey = r.lkey;
    m.foreign = std::make_shared<ImportedMemory>(transport, owner, r.lkey);
    if (int err = ctx->dev().ImportMr(ToPd(pd)->emu, std::move(m))) {
      imports.regions.erase(r.lkey);
      return Fail<ibv_mr>(err);
    }
  }
  ++handles;
  auto* mr = new Mr{};
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.length = r.length;
  mr->mr.handle = mr_handle;
  mr->mr.lkey = mr->mr.rkey = r.lkey;
  mr->imported_owner = owner;
  return &mr->mr;
}

}  // namespace

// ibv_import_mr(3): another handle on an MR of this device, or, through a PD imported from another process, on a
// region of that process (our work requests and our QPs' peers then reach its memory); its addr is NULL, as the man
// page says.
ibv_mr* ibv_import_mr(ibv_pd* pd, uint32_t mr_handle) {
  if (ToPd(pd)->imported_owner != 0) return ImportForeignMr(pd, mr_handle);
  emu::MemoryRegion m;
  if (Ctx(pd->context)->dev().QueryMrByHandle(mr_handle, &m) != 0) return Fail<ibv_mr>(EINVAL);
  if (m.pd != ToPd(pd)->emu) return Fail<ibv_mr>(EINVAL);  // the MR belongs to another PD
  auto* mr = new Mr{};
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.length = m.length;
  mr->mr.handle = mr_handle;
  mr->mr.lkey = m.lkey;
  mr->mr.rkey = m.rkey;
  return &mr->mr;
}

// ibv_unimport_mr(3): forgets the handle without deregistering the MR. The last handle on another process's region
// lets our registration of it go.
void ibv_unimport_mr(ibv_mr* mr) {
  Mr* m = reinterpret_cast<Mr*>(mr);
  if (m->imported_owner != 0) {
    Context* ctx = Ctx(mr->context);
    Engine::Imports& imports = ctx->engine->imports();
    std::lock_guard lock(imports.mu);
    auto it = imports.regions.find(mr->lkey);
    if (it != imports.regions.end() && --it->second == 0) {
      ctx->dev().DeregisterMr(mr->lkey);
      imports.regions.erase(it);
    }
  }
  delete m;
}

int ibv_dereg_mr(ibv_mr* mr) {
  // Another process's region: it is that process's to deregister (ibv_unimport_mr forgets our handle).
  if (reinterpret_cast<Mr*>(mr)->imported_owner != 0) return EOPNOTSUPP;
  if (int err = Ctx(mr->context)->dev().DeregisterMr(mr->lkey)) return err;
  delete reinterpret_cast<Mr*>(mr);
  return 0;
}

// --- completion channels and CQs ---
ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  auto* ch = new CompChannel{};
  if (int err = ch->events.Open()) {
    delete ch;
    return Fail<ibv_comp_channel>(err);
  }
  ch->channel.context = context;
  ch->channel.fd = ch->events.fd();
  ch->channel.refcnt = 0;
  return &ch->channel;
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  if (__atomic_load_n(&channel->refcnt, __ATOMIC_RELAXED) != 0) return EBUSY;  // CQs still use it
  CompChannel* ch = ToChannel(channel);
  ch->events.Close();
  delete ch;
  return 0;
}

static ibv_cq* CreateCqUnguarded(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector) {
  if (comp_vector != 0) return Fail<ibv_cq>(EINVAL);
  ibv_cq_ex* x = NewCq(context, cqe, cq_context, channel, IBV_WC_STANDARD_FLAGS);
  return x ? ibv_cq_ex_to_cq(x) : nullptr;
}

ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector) {
  return NoThrow<ibv_cq*>(nullptr, [&] { return CreateCqUnguarded(context, cqe, cq_context, channel, comp_vector); });
}

static int ResizeCqUnguarded(ibv_cq* cq, int cqe) {
  if (cqe <= 0) return EINVAL;
  if (int err = Ctx(cq->context)->dev().ResizeCq(ToCq(cq)->emu, static_cast<uint32_t>(cqe))) return err;
  cq->cqe = cqe;
  return 0;
}

int ibv_resize_cq(ibv_cq* cq, int cqe) {
  return NoThrow<int>(ENOMEM, [&] { return ResizeCqUnguarded(cq, cqe); });
}

int ibv_destroy_cq(ibv_cq* cq) {
  Cq* c = ToCq(cq);
  if (int err = Ctx(cq->context)->dev().DestroyCq(c->emu)) return err;
  // Its completion events and async events not yet handed out never will be; those that were must be acknowledged
  // first (ibv_get_cq_event(3), ibv_get_async_event(3)).
  if (cq->channel) {
    WaitForAcknowledgements(&cq->mutex, &cq->cond, cq->comp_events_completed,
                            WithdrawEvents(ToChannel(cq->channel)->events, cq, c->comp_events_reported));
  }
  WaitForAcknowledgements(&cq->mutex, &cq->cond, cq->async_events_completed,
                          WithdrawEvents(Ctx(cq->context)->async_events, cq, c->async_events_reported));
  if (cq->channel) __atomic_sub_fetch(&cq->channel->refcnt, 1, __ATOMIC_RELAXED);
  pthread_cond_destroy(&cq->cond);
  pthread_mutex_destroy(&cq->mutex);
  free(c);
  return 0;
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  ibv_cq* got = nullptr;
  if (int err = ToChannel(channel)->events.Pop(&got, [](ibv_cq* const& c) { ++ToCq(c)->comp_events_reported; })) {
    errno = err;
    return -1;
  }
  *cq = got;
  *cq_context = got->cq_context;
  return 0;
}

void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

// --- async events ---
int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  if (int err = Ctx(context)->async_events.Pop(event, CountReported)) {
    errno = err;
    return -1;
  }
  return 0;
}

void ibv_ack_async_event(ibv_async_event* event) {
  // The object's mutex and cond, as rdma-core's: its destroy waits on them (WaitForAcknowledgements, internal.h).
  auto acknowledge = [](pthread_mutex_t* mu, pthread_cond_t* cond, unsigned int* completed) {
    pthread_mutex_lock(mu);
    ++*completed;
    pthread_cond_signal(cond);
    pthread_mutex_unlock(mu);
  };
  switch (ElementOf(event->event_type)) {
    case EventElement::kCq: {
      ibv_cq* cq = event->element.cq;
      acknowledge(&cq->mutex, &cq->cond, &cq->async_events_completed);
      break;
    }
    case EventElement::kQp: {
      ibv_qp* qp = event->element.qp;
      acknowledge(&qp->mutex, &qp->cond, &qp->events_completed);
      break;
    }
    case EventElement::kSrq: {
      ibv_srq* srq = event->element.srq;
      acknowledge(&srq->mutex, &srq->cond, &srq->events_completed);
      break;
    }
    case EventElement::kPort:
      break;
  }
}

// --- address handles ---
ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  emu::AddressHandle* eah = nullptr;
  if (int err = Ctx(pd->context)->dev().CreateAh(ToPd(pd)->emu, ToAddressVector(*attr), &eah))
    return Fail<ibv_ah>(err);
  auto* ah = new Ah{{pd->context, pd, 0}, eah};
  return &ah->ah;
}

int ibv_destroy_ah(ibv_ah* ah) {
  if (int err = Ctx(ah->context)->dev().DestroyAh(ToAh(ah)->emu)) return err;
  delete ToAh(ah);
  return 0;
}

// The GRH slot of a UD receive holds, for RoCEv2 over IPv4, the IPv4 header in its last 20 bytes; over IPv6, the
// IPv6 header. Build the reply's address from it (ibv_init_ah_from_wc(3)).
int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh, ibv_ah_attr* ah_attr) {
  if (port_num != 1 || !(wc->wc_flags & IBV_WC_GRH) || grh == nullptr) return EINVAL;
  std::memset(ah_attr, 0, sizeof *ah_attr);
  const auto* bytes = reinterpret_cast<const uint8_t*>(grh);
  uint8_t src[16] = {}, dst[16] = {};
  const uint8_t* v4 = bytes + 20;
  if ((v4[0] >> 4) == 4) {
    src[10] = src[11] = dst[10] = dst[11] = 0xff;
    std::memcpy(src + 12, v4 + 12, 4);
    std::memcpy(dst + 12, v4 + 16, 4);
    ah_attr->grh.traffic_class = v4[1];
    ah_attr->grh.hop_limit = 0xff;
  } else if ((bytes[0] >> 4) == 6) {
    std::memcpy(src, bytes + 8, 16);
    std::memcpy(dst, bytes + 24, 16);
    ah_attr->grh.hop_limit = 0xff;
  } else {
    return EINVAL;
  }
  std::memcpy(ah_attr->grh.dgid.raw, src, 16);
  // The reply leaves from the GID the datagram came to (the kernel's ib_init_ah_attr_from_wc finds it by the DGID).
  const std::optional<uint32_t> local = Ctx(context)->dev().gids().IndexOf(uroce::wire::IpAddress::FromBytes(dst));
  ah_attr->grh.sgid_index = uint8_t(local.value_or(0));
  ah_attr->is_global = 1;
  ah_attr->port_num = port_num;
  ah_attr->sl = wc->sl;
  ah_attr->dlid = wc->slid;
  return 0;
}

ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  ibv_ah_attr attr;
  if (int err = ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr)) return Fail<ibv_ah>(err);
  return ibv_create_ah(pd, &attr);
}

// UD multicast over RoCEv2 is IP multicast: the device keeps the attachments, the engine joins the IP group so that
// its datagrams arrive (ibv_attach_mcast(3); `lid` has no meaning on RoCE).
int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  if (qp == nullptr || gid == nullptr) return EINVAL;
  return uroce::verbs::NoThrow(ENOMEM, [&] {
    Context* ctx = Ctx(qp->context);
    const wire::IpAddress group = wire::IpAddress::FromBytes(gid->raw);
    bool new_attachment = false;
    if (int err = ctx->dev().AttachMulticast(ToQp(qp)->emu, group, &new_attachment)) return err;
    if (!new_attachment) return 0;  // the engine counts one join per attachment
    if (int err = ctx->engine->JoinMulticast(group)) {
      ctx->dev().DetachMulticast(ToQp(qp)->emu, group);
      return err;
    }
    return 0;
  });
}

int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  if (qp == nullptr || gid == nullptr) return EINVAL;
  Context* ctx = Ctx(qp->context);
  const wire::IpAddress group = wire::IpAddress::FromBytes(gid->raw);
  if (int err = ctx->dev().DetachMulticast(ToQp(qp)->emu, group)) return err;
  ctx->engine->LeaveMulticast(group);
  return 0;
}

}  // extern "C"

namespace uroce::verbs {

emu::AddressVector ToAddressVector(const ibv_ah_attr& a) {
  emu::AddressVector av;
  std::memcpy(av.dgid.data(), a.grh.dgid.raw, 16);
  av.flow_label = a.grh.flow_label;
  av.sgid_index = a.grh.sgid_index;
  av.hop_limit = a.grh.hop_limit;
  av.traffic_class = a.grh.traffic_class;
  av.sl = a.sl;
  av.static_rate = a.static_rate;
  av.port_num = a.port_num;
  av.dlid = a.dlid;
  av.src_path_bits = a.src_path_bits;
  av.is_global = a.is_global != 0;
  return av;
}

ibv_ah_attr FromAddressVector(const emu::AddressVector& av) {
  ibv_ah_attr a{};
  std::memcpy(a.grh.dgid.raw, av.dgid.data(), 16);
  a.grh.flow_label = av.flow_label;
  a.grh.sgid_index = av.sgid_index;
  a.grh.hop_limit = av.hop_limit;
  a.grh.traffic_class = av.traffic_class;
  a.sl = av.sl;
  a.static_rate = av.static_rate;
  a.port_num = av.port_num;
  a.dlid = av.dlid;
  a.src_path_bits = av.src_path_bits;
  a.is_global = av.is_global;
  return a;
}

}  // namespace uroce::verbs
