// Device discovery, contexts and queries: ibv_get_device_list ... ibv_query_gid_type.
#include <infiniband/verbs.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "verbs_api/device_tree.h"
#include "verbs_api/internal.h"
#include "verbs_api/verbs_table.h"
#include "wire/event_fd.h"

using namespace uroce;
using namespace uroce::verbs;

namespace uroce::verbs {

// --- EventQueue -------------------------------------------------------------------------------------------------

template <typename T>
int EventQueue<T>::Open() {
  // EFD_SEMAPHORE: each read takes one event, so the fd stays readable while events remain.
  fd_ = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  return fd_ < 0 ? errno : 0;
}

template <typename T>
void EventQueue<T>::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

template <typename T>
bool EventQueue<T>::Push(const T& item) {
  {
    std::lock_guard lock(mu_);
    if (items_.size() >= kCapacity) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    items_.push_back(Entry{item});
  }
  wire::SignalEventFd(fd_);
  return true;
}

template <typename T>
int EventQueue<T>::Pop(T* item, const std::function<void(const T&)>& reported) {
  for (;;) {
    uint64_t v;
    const ssize_t n = read(fd_, &v, sizeof v);  // one unit (EFD_SEMAPHORE): one entry
    if (n < 0 && errno == EINTR) continue;
    if (n != sizeof v) return n < 0 ? errno : EIO;
    std::lock_guard lock(mu_);
    if (items_.empty()) return EAGAIN;
    const Entry e = items_.front();
    items_.pop_front();
    if (e.withdrawn) continue;  // its unit is taken: look for the next
    if (reported) reported(e.item);
    *item = e.item;
    return 0;
  }
}

template <typename T>
void EventQueue<T>::Withdraw(const std::function<bool(const T&)>& gone, const std::function<void()>& after) {
  std::lock_guard lock(mu_);
  for (Entry& e : items_)
    if (!e.withdrawn && gone(e.item)) e.withdrawn = true;
  after();
}

template class EventQueue<ibv_async_event>;
template class EventQueue<ibv_cq*>;

namespace {
std::mutex g_contexts_mu;
std::set<Context*> g_contexts;
}  // namespace

void DeliverAsyncEvent(Context* ctx, const emu::AsyncEvent& e) {
  ibv_async_event ev{};
  ev.event_type = static_cast<ibv_event_type>(e.type);
  if (e.qp) {
    ev.element.qp = static_cast<ibv_qp*>(e.qp->owner);
  } else if (e.cq) {
    ev.element.cq = static_cast<ibv_cq*>(e.cq->owner);
  } else if (e.srq) {
    ev.element.srq = static_cast<ibv_srq*>(e.srq->owner);  // SRQ limit reached (srq_verbs.cc)
  } else {
    ev.element.port_num = e.port;
  }
  ctx->async_events.Push(ev);
}

}  // namespace uroce::verbs

namespace {

// The single device. ibv_device's layout is public; rdma-core wraps it in a private verbs_device we do not need.
ibv_device* TheDevice() {
  static ibv_device dev = [] {
    ibv_device d{};
    d.node_type = IBV_NODE_CA;
    d.transport_type = IBV_TRANSPORT_IB;  // RoCE devices report IB transport with an Ethernet link layer
    std::strcpy(d.name, "uroce0");
    std::strcpy(d.dev_name, "uverbs0");
    std::strcpy(d.dev_path, "/sys/class/infiniband_verbs/uverbs0");
    std::strcpy(d.ibdev_path, "/sys/class/infiniband/uroce0");
    return d;
  }();
  return &dev;
}


constexpr uint32_t kVendorId = 0x1bad;  // not Mellanox (0x02c9) nor Amazon (0x1d0f): clients take no vendor path
constexpr uint32_t kVendorPartId = 0x0001;
constexpr uint64_t kHcaCoreClockKhz = 1'000'000;  // completion timestamps count nanoseconds

}  // namespace

extern "C" {

#undef ibv_get_device_list
ibv_device** ibv_get_device_list(int* num_devices) {
  auto** list = static_cast<ibv_device**>(calloc(2, sizeof(ibv_device*)));
  if (list == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  list[0] = TheDevice();
  if (num_devices) *num_devices = 1;
  return list;
}

void ibv_free_device_list(ibv_device** list) { free(list); }

const char* ibv_get_device_name(ibv_device* device) { return device ? device->name : nullptr; }

__be64 ibv_get_device_guid(ibv_device* device) { return htobe64(NodeGuid()); }

int ibv_get_device_index(ibv_device* device) { return device == TheDevice() ? 0 : -1; }

}  // extern "C"

namespace {

// The file behind every context's cmd_fd: each context holds its own descriptor of it, so an fd the application
// dup()s from ibv_context::cmd_fd names this process's device, and ibv_import_device(3) recognises it by inode.
// Created once, never closed (contexts of a forked child still hold it).
int DeviceFile() {
  static const int fd = memfd_create("uroce0", MFD_CLOEXEC);
  return fd;
}

bool IsDeviceFile(int fd) {
  struct stat a, b;
  return DeviceFile() >= 0 && fstat(fd, &a) == 0 && fstat(DeviceFile(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

// What the device file says of the device behind it, for a process of the host it is passed to (SCM_RIGHTS): on the
// host device, whose share it is (our owner number and pid) and which host device (network namespace and address).
struct DeviceFileRecord {
  static constexpr uint64_t kMagic = 0x75726f63'436d6431ULL;  // "urocCmd1"
  uint64_t magic = 0;
  int32_t pid = 0;
  uint8_t owner = 0;  // 0: a per-process device (nothing to import from another process)
  uint8_t unused[3] = {};
  uint64_t netns = 0;  // the inode of the network namespace
  uint8_t address[16] = {};
};

uint64_t NetworkNamespace() {
  struct stat st;
  return stat("/proc/self/ns/net", &st) == 0 ? uint64_t(st.st_ino) : 0;
}

DeviceFileRecord RecordOf(Engine& engine) {
  DeviceFileRecord r;
  r.magic = DeviceFileRecord::kMagic;
  r.pid = getpid();
  if (engine.host_transport() != nullptr) r.owner = engine.host_transport()->owner();
  r.netns = NetworkNamespace();
  std::memcpy(r.address, engine.address().bytes().data(), sizeof r.address);
  return r;
}

// Written whenever a context opens (the engine, and with it the owner number, may be a new one since the last).
void WriteDeviceFileRecord(Engine& engine) {
  const DeviceFileRecord r = RecordOf(engine);
  if (pwrite(DeviceFile(), &r, sizeof r, 0) != ssize_t(sizeof r)) return;  // then nobody can import from us
}

// The owner number of the process whose device file `fd` is, when it shares our host device (same network namespace
// and address, another owner number, alive); 0 when it does not.
uint8_t ImportableOwner(int fd, Engine& engine) {
  DeviceFileRecord theirs;
  if (pread(fd, &theirs, sizeof theirs, 0) != ssize_t(sizeof theirs) || theirs.magic != DeviceFileRecord::kMagic)
    return 0;
  const DeviceFileRecord ours = RecordOf(engine);
  if (ours.owner == 0 || theirs.owner == 0 || theirs.owner == ours.owner || theirs.netns != ours.netns ||
      std::memcmp(theirs.address, ours.address, sizeof ours.address) != 0 || kill(theirs.pid, 0) != 0)
    return 0;
  return theirs.owner;
}

// A new context on the process's engine that owns `cmd_fd` (closed by ibv_close_device, also on failure here).
ibv_context* NewContext(ibv_device* device, int cmd_fd) {
  auto fail = [cmd_fd](int err) -> ibv_context* {
    if (cmd_fd >= 0) close(cmd_fd);
    errno = err;
    return nullptr;
  };
  auto engine = Engine::Acquire();
  if (!engine) return fail(errno);
  auto* ctx = static_cast<Context*>(calloc(1, sizeof(Context)));
  if (ctx == nullptr) return fail(ENOMEM);
  new (&ctx->engine) std::shared_ptr<Engine>(std::move(engine));
  new (&ctx->async_events) EventQueue<ibv_async_event>();
  if (int err = ctx->async_events.Open()) {
    ctx->async_events.~EventQueue();
    ctx->engine.~shared_ptr();
    free(ctx);
    return fail(err);
  }
  verbs_context& v = ctx->vctx;
  FillContextOps(&v);
  v.sz = sizeof(verbs_context);
  ibv_context& c = v.context;
  c.device = device;
  c.cmd_fd = cmd_fd;
  c.async_fd = ctx->async_events.fd();
  c.num_comp_vectors = 1;
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  WriteDeviceFileRecord(*ctx->engine);
  {
    std::lock_guard lock(g_contexts_mu);
    g_contexts.insert(ctx);
  }
  // Every context of the process shares the device; an event goes to the context owning its object, a port event to
  // all. Installed outside g_contexts_mu: the handler runs under a QP's lock in the device and takes g_contexts_mu.
  ctx->dev().set_async_handler([](const emu::AsyncEvent& e) {
    if (e.qp != nullptr && e.qp->owner == nullptr) return;  // a QP no handle of ours holds (an XRC target others do)
    std::lock_guard lock(g_contexts_mu);
    for (Context* each : g_contexts) {
      void* owner = e.qp ? e.qp->owner : e.cq ? e.cq->owner : e.srq ? e.srq->owner : nullptr;
      ibv_context* oc = nullptr;
      if (e.qp && owner) oc = static_cast<ibv_qp*>(owner)->context;
      if (e.cq && owner) oc = static_cast<ibv_cq*>(owner)->context;
      if (e.srq && owner) oc = static_cast<ibv_srq*>(owner)->context;
      if (oc == nullptr || oc == &each->vctx.context) DeliverAsyncEvent(each, e);
    }
  });
  return &c;
}

}  // namespace

extern "C" {

static ibv_context* OpenDeviceUnguarded(ibv_device* device) {
  if (device != TheDevice()) {
    errno = ENODEV;
    return nullptr;
  }
  if (DeviceFile() < 0) return nullptr;  // errno from memfd_create
  const int cmd_fd = fcntl(DeviceFile(), F_DUPFD_CLOEXEC, 0);
  if (cmd_fd < 0) return nullptr;
  return NewContext(device, cmd_fd);
}

ibv_context* ibv_open_device(ibv_device* device) {
  return NoThrow<ibv_context*>(nullptr, [&] { return OpenDeviceUnguarded(device); });
}

// ibv_import_device(3): a context on the device behind a dup of another context's cmd_fd; it owns that fd. Within
// one process every context shares the one device, so objects created through either are visible to both by handle
// (ibv_import_pd, ibv_import_mr, ibv_import_dm). Another process's cmd_fd (passed with SCM_RIGHTS) names the same
// device when both share the host device: the context then reaches that process's PDs and regions (ibv_import_pd,
// ibv_import_mr); otherwise it names a device this process does not have: ENODEV.
ibv_context* ibv_import_device(int cmd_fd) {
  struct stat st;
  if (fstat(cmd_fd, &st) != 0) return nullptr;  // EBADF
  if (IsDeviceFile(cmd_fd)) return NewContext(TheDevice(), cmd_fd);
  auto engine = Engine::Acquire();
  if (!engine) return nullptr;
  const uint8_t owner = ImportableOwner(cmd_fd, *engine);
  if (owner == 0) {
    errno = ENODEV;
    return nullptr;
  }
  ibv_context* context = NewContext(TheDevice(), cmd_fd);
  if (context != nullptr) Ctx(context)->imported_owner = owner;
  return context;
}

int ibv_close_device(ibv_context* context) {
  Context* ctx = Ctx(context);
  if (context->cmd_fd >= 0) close(context->cmd_fd);
  {
    std::lock_guard lock(g_contexts_mu);
    g_contexts.erase(ctx);
  }
  ctx->async_events.Close();
  ctx->async_events.~EventQueue();
  pthread_mutex_destroy(&context->mutex);
  ctx->engine.~shared_ptr();
  free(ctx);
  return 0;
}

int ibv_query_device(ibv_context* context, ibv_device_attr* a) {
  const emu::DeviceConfig& cfg = Ctx(context)->dev().config();
  const emu::DeviceLimits& l = cfg.limits;
  std::memset(a, 0, sizeof *a);
  std::snprintf(a->fw_ver, sizeof a->fw_ver, "uroce 0.1");
  a->node_guid = htobe64(cfg.node_guid);
  a->sys_image_guid = htobe64(cfg.node_guid);
  a->max_mr_size = l.max_mr_size;
  a->page_size_cap = 0xfffff000;  // any 4 KiB multiple
  a->vendor_id = kVendorId;
  a->vendor_part_id = kVendorPartId;
  a->hw_ver = 1;
  a->max_qp = static_cast<int>(l.max_qp);
  a->max_qp_wr = static_cast<int>(l.max_qp_wr);
  // Memory windows of both types, type 2 checked against the QP and the PD (2B, as rxe and mlx5 report), and the
  // memory-management extensions userspace can use: LOCAL_INV and SEND_WITH_INV (README's support table).
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID |
                        IBV_DEVICE_N_NOTIFY_CQ | IBV_DEVICE_RESIZE_MAX_WR | IBV_DEVICE_SRQ_RESIZE | IBV_DEVICE_XRC |
                        IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_MEM_MGT_EXTENSIONS;
  a->max_sge = static_cast<int>(l.max_sge);
  a->max_sge_rd = static_cast<int>(l.max_sge_rd);
  a->max_cq = static_cast<int>(l.max_cq);
  a->max_cqe = static_cast<int>(l.max_cqe);
  a->max_mr = static_cast<int>(l.max_mr);
  a->max_pd = static_cast<int>(l.max_pd);
  a->max_qp_rd_atom = static_cast<int>(l.max_qp_rd_atom);
  a->max_ee_rd_atom = 0;
  a->max_res_rd_atom = static_cast<int>(l.max_qp_rd_atom * l.max_qp);
  a->max_qp_init_rd_atom = static_cast<int>(l.max_qp_init_rd_atom);
  a->atomic_cap = IBV_ATOMIC_HCA;
  a->max_ah = static_cast<int>(l.max_ah);
  a->max_srq = static_cast<int>(l.max_srq);
  a->max_srq_wr = static_cast<int>(l.max_srq_wr);
  a->max_srq_sge = static_cast<int>(l.max_srq_sge);
  a->max_mw = static_cast<int>(l.max_mw);
  a->max_mcast_grp = static_cast<int>(l.max_mcast_grp);
  a->max_mcast_qp_attach = static_cast<int>(l.max_mcast_qp_attach);
  a->max_total_mcast_qp_attach = static_cast<int>(l.max_total_mcast_qp_attach);
  a->max_pkeys = l.max_pkeys;
  a->local_ca_ack_delay = l.local_ca_ack_delay;
  a->phys_port_cnt = 1;
  return 0;
}

}  // extern "C"

namespace {

// The port's GID table (emu::GidTable): the device's address at entry 0, the host's others after it, and empty
// entries, as rxe and NICs list a table larger than the addresses they hold. An empty entry reads as the zero GID
// through ibv_query_gid and RoCE v1 through ibv_query_gid_type (rdma-core keeps that for empty entries) and as
// ENODATA through ibv_query_gid_ex; an index past the table is EINVAL.
enum class GidSlot { kPopulated, kEmpty, kOutside };
GidSlot ClassifyGid(ibv_context* context, uint32_t port_num, uint32_t index, uroce::wire::IpAddress* gid = nullptr) {
  if (port_num != 1 || index >= Ctx(context)->dev().config().limits.gid_table_len) return GidSlot::kOutside;
  const std::optional<uroce::wire::IpAddress> at = Ctx(context)->dev().gids().At(index);
  if (!at) return GidSlot::kEmpty;
  if (gid != nullptr) *gid = *at;
  return GidSlot::kPopulated;
}

// Fills `entry` (entry_size checked by the caller) for populated entry `index` holding `gid`.
void FillGidEntry(const uroce::wire::IpAddress& gid, uint32_t index, ibv_gid_entry* entry) {
  std::memset(entry, 0, sizeof *entry);
  std::memcpy(entry->gid.raw, gid.bytes().data(), 16);
  entry->gid_index = index;
  entry->port_num = 1;
  entry->gid_type = IBV_GID_TYPE_ROCE_V2;
  entry->ndev_ifindex = NetdevOf(gid).index;  // the interface holding the address
}

}  // namespace

namespace uroce::verbs {

int QueryPort(ibv_context* context, uint8_t port_num, ibv_port_attr* a, size_t len) {
  if (port_num != 1) return EINVAL;
  const emu::DeviceConfig& cfg = Ctx(context)->dev().config();
  ibv_port_attr p{};
  p.state = IBV_PORT_ACTIVE;
  p.max_mtu = IBV_MTU_4096;
  p.active_mtu = static_cast<ibv_mtu>(cfg.active_mtu);
  p.gid_tbl_len = static_cast<int>(cfg.limits.gid_table_len);
  p.port_cap_flags = 0;
  p.max_msg_sz = cfg.limits.max_msg_sz;
  p.pkey_tbl_len = cfg.limits.max_pkeys;
  p.lid = 0;  // RoCE has no LIDs
  p.max_vl_num = 1;
  p.active_width = 2;   // 4x
  p.active_speed = 32;  // 25 Gb/s class (EDR); a software device has no real rate
  p.phys_state = 5;     // LinkUp
  p.link_layer = IBV_LINK_LAYER_ETHERNET;
  p.flags = 0;
  std::memcpy(a, &p, std::min(len, sizeof p));
  return 0;
}

int QueryDeviceEx(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                  size_t attr_size) {
  if (input && input->comp_mask) return EINVAL;
  if (attr_size < sizeof(ibv_device_attr)) return EINVAL;
  ibv_device_attr_ex x{};
  ibv_query_device(context, &x.orig_attr);
  x.completion_timestamp_mask = ~uint64_t{0};
  x.hca_core_clock = kHcaCoreClockKhz;
  x.device_cap_flags_ex = x.orig_attr.device_cap_flags;
  // Every region is already on demand (nothing is pinned), implicit regions included (README).
  constexpr uint32_t kOdpAll = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                               IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  x.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
  x.odp_caps.per_transport_caps.rc_odp_caps = kOdpAll;
  x.odp_caps.per_transport_caps.uc_odp_caps = kOdpAll;
  x.odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV;
  x.xrc_odp_caps = kOdpAll;
  x.max_dm_size = kMaxDmBytes;
  x.phys_port_cnt_ex = 1;
  std::memcpy(attr, &x, std::min(attr_size, sizeof x));
  return 0;
}

}  // namespace uroce::verbs

extern "C" {

int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  uroce::wire::IpAddress at;  // the zero GID for an empty entry
  const GidSlot slot =
      index < 0 ? GidSlot::kOutside : ClassifyGid(context, port_num, static_cast<uint32_t>(index), &at);
  if (slot == GidSlot::kOutside) {
    errno = EINVAL;
    return -1;  // ibv_query_gid(3): returns -1 on error
  }
  std::memcpy(gid->raw, at.bytes().data(), 16);
  return 0;
}

int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  if (port_num != 1 || index != 0) {
    errno = EINVAL;
    return -1;
  }
  *pkey = htobe16(0xffff);
  return 0;
}

int ibv_get_pkey_index(ibv_context* context, uint8_t port_num, __be16 pkey) {
  if (port_num != 1 || (be16toh(pkey) & 0x7fff) != 0x7fff) {
    errno = ENOENT;
    return -1;
  }
  return 0;
}

// IBVERBS_PRIVATE_34: ibv_devinfo and pyverbs ask whether GID entries are RoCE v1 or v2.
// enum ibv_gid_type_sysfs lives in rdma-core's private driver.h: 0 = IB/RoCE v1, 1 = RoCE v2.
int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, int* type) {
  const GidSlot slot = ClassifyGid(context, port_num, index);
  if (slot == GidSlot::kOutside) {
    errno = EINVAL;
    return -1;
  }
  *type = slot == GidSlot::kPopulated ? 1 : 0;  // IBV_GID_TYPE_SYSFS_ROCE_V2 : _IB_ROCE_V1 (an empty entry)
  return 0;
}

int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                      uint32_t flags, size_t entry_size) {
  if (flags) return EINVAL;
  uroce::wire::IpAddress gid;
  const GidSlot slot = ClassifyGid(context, port_num, gid_index, &gid);
  if (slot != GidSlot::kPopulated) return slot == GidSlot::kEmpty ? ENODATA : EINVAL;
  if (entry_size < sizeof(ibv_gid_entry)) return EINVAL;
  FillGidEntry(gid, gid_index, entry);
  return 0;
}

ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags,
                             size_t entry_size) {
  // ibv_query_gid_table(3): the populated entries, in index order; EINVAL when they do not all fit.
  if (flags) return -EINVAL;
  if (entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  const auto populated = Ctx(context)->dev().gids().Populated();
  if (max_entries < populated.size()) return -EINVAL;
  for (size_t i = 0; i < populated.size(); ++i) {
    FillGidEntry(populated[i].second, populated[i].first,
                 reinterpret_cast<ibv_gid_entry*>(reinterpret_cast<uint8_t*>(entries) + i * entry_size));
  }
  return ssize_t(populated.size());
}

// The exported ibv_query_port (IBVERBS_1.1) for binaries built before verbs.h made it an inline that calls
// verbs_context.query_port.
#undef ibv_query_port
int ibv_query_port(ibv_context* context, uint8_t port_num, struct _compat_ibv_port_attr* port_attr) {
  return QueryPort(context, port_num, reinterpret_cast<ibv_port_attr*>(port_attr), offsetof(ibv_port_attr, flags));  // the legacy struct ends at link_layer
}

int ibv_fork_init(void) { return 0; }  // nothing is pinned: fork is always safe

enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

}  // extern "C"
