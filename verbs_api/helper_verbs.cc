// The exported helpers of libibverbs that are not verbs on a device: sysfs paths, rate conversions, fork ranges, the
// kernel-ABI copies, L2 address resolution; and the verbs this device answers with EOPNOTSUPP by design (README,
// "Exported calls that answer EOPNOTSUPP"). Each behaves as rdma-core v44's does (libibverbs/verbs.c, sysfs.c,
// marshall.c, neigh.c); the values are facts of the ABI.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <linux/if_vlan.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <poll.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <array>
#include <optional>
#include <string>

#include "verbs_api/device_tree.h"
#include "verbs_api/internal.h"

namespace {

// One rate: its enum value, the multiple of 2.5 Gb/s it is (0: not one), its Mb/s.
struct RateRow {
  ibv_rate rate;
  int mult;
  int mbps;
};
constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},      {IBV_RATE_5_GBPS, 2, 5000},        {IBV_RATE_10_GBPS, 4, 10000},
    {IBV_RATE_20_GBPS, 8, 20000},      {IBV_RATE_30_GBPS, 12, 30000},     {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},     {IBV_RATE_80_GBPS, 32, 80000},     {IBV_RATE_120_GBPS, 48, 120000},
    {IBV_RATE_14_GBPS, 0, 14062},      {IBV_RATE_56_GBPS, 0, 56250},      {IBV_RATE_112_GBPS, 0, 112500},
    {IBV_RATE_168_GBPS, 0, 168750},    {IBV_RATE_25_GBPS, 0, 25781},      {IBV_RATE_100_GBPS, 0, 103125},
    {IBV_RATE_200_GBPS, 0, 206250},    {IBV_RATE_300_GBPS, 0, 309375},    {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},     {IBV_RATE_400_GBPS, 160, 425000},  {IBV_RATE_600_GBPS, 240, 637500},
    {IBV_RATE_800_GBPS, 320, 850000},  {IBV_RATE_1200_GBPS, 480, 1275000},
};

void CopyAhAttrFromKernel(ibv_ah_attr* dst, const ib_uverbs_ah_attr* src) {
  std::memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof dst->grh.dgid);
  dst->grh.flow_label = src->grh.flow_label;
  dst->grh.sgid_index = src->grh.sgid_index;
  dst->grh.hop_limit = src->grh.hop_limit;
  dst->grh.traffic_class = src->grh.traffic_class;
  dst->dlid = src->dlid;
  dst->sl = src->sl;
  dst->src_path_bits = src->src_path_bits;
  dst->static_rate = src->static_rate;
  dst->is_global = src->is_global;
  dst->port_num = src->port_num;
}

// The path record's fields, one list for both directions (ibv_sa_path_rec <-> ib_user_path_rec).
template <typename To, typename From>
void CopyPathRecord(To* dst, const From* src) {
  dst->dlid = src->dlid;
  dst->slid = src->slid;
  dst->raw_traffic = src->raw_traffic;
  dst->flow_label = src->flow_label;
  dst->hop_limit = src->hop_limit;
  dst->traffic_class = src->traffic_class;
  dst->reversible = src->reversible;
  dst->numb_path = src->numb_path;
  dst->pkey = src->pkey;
  dst->sl = src->sl;
  dst->mtu_selector = src->mtu_selector;
  dst->mtu = src->mtu;
  dst->rate_selector = src->rate_selector;
  dst->rate = src->rate;
  dst->packet_life_time = src->packet_life_time;
  dst->preference = src->preference;
  dst->packet_life_time_selector = src->packet_life_time_selector;
}

// --- L2 resolution (ibv_resolve_eth_l2_from_gid): the route, then the neighbour table, over rtnetlink ------------

using Bytes16 = std::array<uint8_t, 16>;

// Sends one rtnetlink request and hands each answering message to `on_message` until the answer ends. 0 or errno.
template <typename OnMessage>
int RtnetlinkAsk(const void* request, size_t len, OnMessage on_message) {
  const int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) return errno;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  int err = 0;
  if (sendto(fd, request, len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) err = errno;
  alignas(nlmsghdr) char buf[32768];
  for (bool done = err != 0; !done;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0) {
      err = errno;
      break;
    }
    size_t left = size_t(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); !done && NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_type == NLMSG_DONE) {
        done = true;
      } else if (h->nlmsg_type == NLMSG_ERROR) {
        err = -static_cast<nlmsgerr*>(NLMSG_DATA(h))->error;
        done = true;
      } else {
        on_message(h);
        if (!(h->nlmsg_flags & NLM_F_MULTI)) done = true;
      }
    }
  }
  close(fd);
  return err;
}

// The attribute `type` of a route or neighbour message (after its fixed header of `header` bytes), or nullptr.
const rtattr* FindAttribute(const nlmsghdr* h, size_t header, unsigned short type) {
  auto* a = reinterpret_cast<const rtattr*>(reinterpret_cast<const char*>(NLMSG_DATA(h)) + NLMSG_ALIGN(header));
  int left = int(h->nlmsg_len) - int(NLMSG_LENGTH(header));
  for (; RTA_OK(a, left); a = RTA_NEXT(a, left))
    if (a->rta_type == type) return a;
  return nullptr;
}

int AddressBytes(int family) { return family == AF_INET ? 4 : 16; }

struct Route {
  int type = -1;  // RTN_*
  std::optional<Bytes16> gateway;
};

// The kernel's route to `dst` (its first AddressBytes(family) bytes).
int RouteTo(int family, const Bytes16& dst, Route* out) {
  struct {
    nlmsghdr h;
    rtmsg r;
    char attrs[64];
  } req{};
  req.h.nlmsg_len = NLMSG_LENGTH(sizeof(rtmsg));
  req.h.nlmsg_type = RTM_GETROUTE;
  req.h.nlmsg_flags = NLM_F_REQUEST;
  req.r.rtm_family = static_cast<unsigned char>(family);
  req.r.rtm_dst_len = static_cast<unsigned char>(AddressBytes(family) * 8);
  auto* a = reinterpret_cast<rtattr*>(reinterpret_cast<char*>(&req) + NLMSG_ALIGN(req.h.nlmsg_len));
  a->rta_type = RTA_DST;
  a->rta_len = static_cast<unsigned short>(RTA_LENGTH(AddressBytes(family)));
  std::memcpy(RTA_DATA(a), dst.data(), AddressBytes(family));
  req.h.nlmsg_len = NLMSG_ALIGN(req.h.nlmsg_len) + RTA_ALIGN(a->rta_len);
  return RtnetlinkAsk(&req, req.h.nlmsg_len, [&](const nlmsghdr* h) {
    if (h->nlmsg_type != RTM_NEWROUTE) return;
    out->type = static_cast<const rtmsg*>(NLMSG_DATA(h))->rtm_type;
    if (const rtattr* g = FindAttribute(h, sizeof(rtmsg), RTA_GATEWAY)) {
      Bytes16 gw{};
      std::memcpy(gw.data(), RTA_DATA(g), std::min<size_t>(RTA_PAYLOAD(g), gw.size()));
      out->gateway = gw;
    }
  });
}

// The link-layer address the neighbour table holds for `ip` on interface `ifindex`, if it is usable.
std::optional<std::array<uint8_t, 6>> NeighbourMac(int family, const Bytes16& ip, int ifindex) {
  struct {
    nlmsghdr h;
    ndmsg n;
  } req{};
  req.h.nlmsg_len = NLMSG_LENGTH(sizeof(ndmsg));
  req.h.nlmsg_type = RTM_GETNEIGH;
  req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  req.n.ndm_family = static_cast<unsigned char>(family);
  std::optional<std::array<uint8_t, 6>> mac;
  constexpr uint16_t kUsable = NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT | NUD_NOARP;
  RtnetlinkAsk(&req, req.h.nlmsg_len, [&](const nlmsghdr* h) {
    const auto* n = static_cast<const ndmsg*>(NLMSG_DATA(h));
    if (h->nlmsg_type != RTM_NEWNEIGH || n->ndm_ifindex != ifindex || !(n->ndm_state & kUsable)) return;
    const rtattr* dst = FindAttribute(h, sizeof(ndmsg), NDA_DST);
    const rtattr* ll = FindAttribute(h, sizeof(ndmsg), NDA_LLADDR);
    if (dst && ll && RTA_PAYLOAD(dst) == size_t(AddressBytes(family)) && RTA_PAYLOAD(ll) == 6 &&
        std::memcmp(RTA_DATA(dst), ip.data(), AddressBytes(family)) == 0) {
      mac.emplace();
      std::memcpy(mac->data(), RTA_DATA(ll), 6);
    }
  });
  return mac;
}

// An interface's own MAC (lo's is all zeros) and its VLAN id (0xffff when it is no VLAN device), by name.
bool InterfaceMac(const std::string& name, uint8_t mac[6]) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ifreq r{};
  std::snprintf(r.ifr_name, sizeof r.ifr_name, "%s", name.c_str());
  const bool ok = ioctl(fd, SIOCGIFHWADDR, &r) == 0;
  close(fd);
  if (ok) std::memcpy(mac, r.ifr_hwaddr.sa_data, 6);
  return ok;
}

uint16_t InterfaceVlan(const std::string& name) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0xffff;
  vlan_ioctl_args v{};
  v.cmd = GET_VLAN_VID_CMD;
  std::snprintf(v.device1, sizeof v.device1, "%s", name.c_str());
  const bool vlan = ioctl(fd, SIOCGIFVLAN, &v) == 0;
  close(fd);
  return vlan && v.u.VID >= 0 && v.u.VID <= 0xfff ? static_cast<uint16_t>(v.u.VID) : 0xffff;
}

// Makes the kernel resolve `ip`'s neighbour entry: a datagram to its discard port (9) from `src`, as rdma-core does.
void TriggerResolution(int family, const Bytes16& src, const Bytes16& ip) {
  const int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_storage from{}, to{};
  socklen_t len;
  if (family == AF_INET) {
    auto* f = reinterpret_cast<sockaddr_in*>(&from);
    auto* t = reinterpret_cast<sockaddr_in*>(&to);
    f->sin_family = t->sin_family = AF_INET;
    std::memcpy(&f->sin_addr, src.data(), 4);
    std::memcpy(&t->sin_addr, ip.data(), 4);
    t->sin_port = htons(9);
    len = sizeof(sockaddr_in);
  } else {
    auto* f = reinterpret_cast<sockaddr_in6*>(&from);
    auto* t = reinterpret_cast<sockaddr_in6*>(&to);
    f->sin6_family = t->sin6_family = AF_INET6;
    std::memcpy(&f->sin6_addr, src.data(), 16);
    std::memcpy(&t->sin6_addr, ip.data(), 16);
    t->sin6_port = htons(9);
    len = sizeof(sockaddr_in6);
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), len) == 0) {
    const char probe = 0;
    (void)!sendto(fd, &probe, 1, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&to), len);
  }
  close(fd);
}

// A GID as the address it holds: (family, bytes): an IPv4-mapped GID is IPv4 (4 bytes first).
std::pair<int, Bytes16> GidAddress(const uint8_t gid[16]) {
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  Bytes16 b{};
  if (std::memcmp(gid, kMapped, 12) == 0) {
    std::memcpy(b.data(), gid + 12, 4);
    return {AF_INET, b};
  }
  std::memcpy(b.data(), gid, 16);
  return {AF_INET6, b};
}

}  // namespace

extern "C" {

const char* ibv_get_sysfs_path(void) {
  // SYSFS_PATH without its trailing slashes, unless the program runs set-uid (then /sys), as rdma-core.
  static const std::string path = [] {
    const char* env = getuid() == geteuid() ? std::getenv("SYSFS_PATH") : nullptr;
    if (env == nullptr) return std::string("/sys");
    std::string p(env, strnlen(env, IBV_SYSFS_PATH_MAX));
    while (!p.empty() && p.back() == '/') p.pop_back();
    return p;
  }();
  return path.c_str();
}

int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  const std::string path = std::string(dir) + "/" + file;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t len = read(fd, buf, size);
  close(fd);
  if (len > 0) {
    // The contents without a trailing newline, NUL-terminated; a file too long to terminate fails.
    if (buf[len - 1] == '\n') buf[--len] = '\0';
    else if (size_t(len) < size) buf[len] = '\0';
    else return -1;
  }
  return static_cast<int>(len);
}

int ibv_rate_to_mult(ibv_rate rate) {
  for (const RateRow& r : kRates)
    if (r.rate == rate && r.mult != 0) return r.mult;
  return -1;
}

ibv_rate mult_to_ibv_rate(int mult) {
  for (const RateRow& r : kRates)
    if (r.mult == mult && mult != 0) return r.rate;
  return IBV_RATE_MAX;
}

int ibv_rate_to_mbps(ibv_rate rate) {
  for (const RateRow& r : kRates)
    if (r.rate == rate) return r.mbps;
  return -1;
}

ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const RateRow& r : kRates)
    if (r.mbps == mbps) return r.rate;
  return IBV_RATE_MAX;
}

// Nothing is pinned (ibv_is_fork_initialized: IBV_FORK_UNNEEDED), so a range needs no madvise either way: rdma-core
// returns 0 the same way when fork support is unneeded.
int ibv_dontfork_range(void*, size_t) { return 0; }
int ibv_dofork_range(void*, size_t) { return 0; }

void ibv_copy_ah_attr_from_kern(ibv_ah_attr* dst, ib_uverbs_ah_attr* src) { CopyAhAttrFromKernel(dst, src); }

void ibv_copy_qp_attr_from_kern(ibv_qp_attr* dst, ib_uverbs_qp_attr* src) {
  dst->cur_qp_state = static_cast<ibv_qp_state>(src->cur_qp_state);
  dst->path_mtu = static_cast<ibv_mtu>(src->path_mtu);
  dst->path_mig_state = static_cast<ibv_mig_state>(src->path_mig_state);
  dst->qkey = src->qkey;
  dst->rq_psn = src->rq_psn;
  dst->sq_psn = src->sq_psn;
  dst->dest_qp_num = src->dest_qp_num;
  dst->qp_access_flags = src->qp_access_flags;
  dst->cap.max_send_wr = src->max_send_wr;
  dst->cap.max_recv_wr = src->max_recv_wr;
  dst->cap.max_send_sge = src->max_send_sge;
  dst->cap.max_recv_sge = src->max_recv_sge;
  dst->cap.max_inline_data = src->max_inline_data;
  CopyAhAttrFromKernel(&dst->ah_attr, &src->ah_attr);
  CopyAhAttrFromKernel(&dst->alt_ah_attr, &src->alt_ah_attr);
  dst->pkey_index = src->pkey_index;
  dst->alt_pkey_index = src->alt_pkey_index;
  dst->en_sqd_async_notify = src->en_sqd_async_notify;
  dst->sq_draining = src->sq_draining;
  dst->max_rd_atomic = src->max_rd_atomic;
  dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
  dst->min_rnr_timer = src->min_rnr_timer;
  dst->port_num = src->port_num;
  dst->timeout = src->timeout;
  dst->retry_cnt = src->retry_cnt;
  dst->rnr_retry = src->rnr_retry;
  dst->alt_port_num = src->alt_port_num;
  dst->alt_timeout = src->alt_timeout;
}

void ibv_copy_path_rec_from_kern(ibv_sa_path_rec* dst, ib_user_path_rec* src) {
  std::memcpy(dst->dgid.raw, src->dgid, sizeof dst->dgid);
  std::memcpy(dst->sgid.raw, src->sgid, sizeof dst->sgid);
  CopyPathRecord(dst, src);
}

void ibv_copy_path_rec_to_kern(ib_user_path_rec* dst, ibv_sa_path_rec* src) {
  std::memcpy(dst->dgid, src->dgid.raw, sizeof src->dgid);
  std::memcpy(dst->sgid, src->sgid.raw, sizeof src->sgid);
  CopyPathRecord(dst, src);
}

// The Ethernet address (and VLAN) of the next hop towards attr->grh.dgid from the port's GID sgid_index: the
// destination's own interface MAC for an address of this host, the multicast MAC for a multicast group, else the
// neighbour table's entry for the destination (or its gateway), resolved by the kernel when absent (a datagram to
// its discard port, then up to 3 s). 0, or -EINVAL (no interface holds the source GID), -EHOSTUNREACH, or
// ibv_query_gid's error.
int ibv_resolve_eth_l2_from_gid(ibv_context* context, ibv_ah_attr* attr, uint8_t eth_mac[6], uint16_t* vid) {
  ibv_gid sgid;
  if (int err = ibv_query_gid(context, attr->port_num, attr->grh.sgid_index, &sgid)) return err;
  const auto [src_family, src] = GidAddress(sgid.raw);
  const auto [family, dst] = GidAddress(attr->grh.dgid.raw);
  const uroce::verbs::Netdev out = uroce::verbs::NetdevOf(uroce::wire::IpAddress::FromBytes(sgid.raw));
  if (out.index == 0 || src_family != family) return -EINVAL;
  std::array<uint8_t, 6> mac{};
  bool found = false;
  if (family == AF_INET ? (dst[0] & 0xf0) == 0xe0 : dst[0] == 0xff) {
    // IP multicast maps onto Ethernet multicast (RFC 1112 6.4: 01:00:5e + the group's low 23 bits; RFC 2464 7:
    // 33:33 + the group's low 32 bits).
    mac = family == AF_INET ? std::array<uint8_t, 6>{0x01, 0x00, 0x5e, uint8_t(dst[1] & 0x7f), dst[2], dst[3]}
                            : std::array<uint8_t, 6>{0x33, 0x33, dst[12], dst[13], dst[14], dst[15]};
    found = true;
  } else {
    Route route;
    if (RouteTo(family, dst, &route) != 0 || route.type < 0) return -EHOSTUNREACH;
    if (route.type == RTN_BLACKHOLE || route.type == RTN_UNREACHABLE || route.type == RTN_PROHIBIT ||
        route.type == RTN_THROW)
      return -EHOSTUNREACH;
    if (route.type == RTN_LOCAL) {
      found = InterfaceMac(out.name, mac.data());  // an address of this host: the source interface's own MAC
    } else {
      const Bytes16 hop = route.gateway.value_or(dst);
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      for (int tries = 0; !found; ++tries) {
        if (auto m = NeighbourMac(family, hop, int(out.index))) {
          mac = *m;
          found = true;
        } else if (std::chrono::steady_clock::now() >= give_up) {
          break;
        } else {
          if (tries % 10 == 0) TriggerResolution(family, src, hop);
          poll(nullptr, 0, 30);
        }
      }
    }
  }
  if (!found) return -EHOSTUNREACH;
  std::memcpy(eth_mac, mac.data(), 6);
  if (vid) *vid = InterfaceVlan(out.name);
  return 0;
}

// Enhanced connection establishment (ibv_set_ece(3)): a device without ECE answers EOPNOTSUPP, as rdma-core's
// default for providers without it (rxe among them).
int ibv_query_ece(ibv_qp*, ibv_ece* ece) { return ece ? EOPNOTSUPP : EINVAL; }
int ibv_set_ece(ibv_qp*, ibv_ece* ece) {
  if (ece == nullptr || ece->comp_mask) return EINVAL;
  return EOPNOTSUPP;
}

// dma-buf memory regions need a kernel driver that imports the buffer for DMA: not supported (README).
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  errno = EOPNOTSUPP;
  return nullptr;
}

}  // extern "C"
