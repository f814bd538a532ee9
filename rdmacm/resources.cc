// QPs, SRQs and endpoints made through the CM (rdma_create_qp(3), rdma_create_srq(3), rdma_create_ep(3)),
// rdma_getaddrinfo(3), and UD multicast (rdma_join_multicast(3)).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "rdmacm/internal.h"

using namespace uroce;
using namespace uroce::rdmacm;

namespace {

// A CQ of `size` entries with its own completion channel and `cq_context == id` (rdma_get_send_comp /
// rdma_get_recv_comp assert it).
int CreateCq(IdPriv* p, int size, ibv_comp_channel** channel, ibv_cq** cq) {
  *channel = ibv_create_comp_channel(p->id.verbs);
  if (*channel == nullptr) return errno;
  *cq = ibv_create_cq(p->id.verbs, size > 0 ? size : 1, &p->id, *channel, 0);
  if (*cq == nullptr) {
    const int err = errno;
    ibv_destroy_comp_channel(*channel);
    *channel = nullptr;
    return err;
  }
  return 0;
}

void DestroyCq(ibv_comp_channel** channel, ibv_cq** cq) {
  if (*cq) ibv_destroy_cq(*cq);
  // rsockets stores one channel in both fields: destroy it once.
  if (*channel) ibv_destroy_comp_channel(*channel);
  *cq = nullptr;
  *channel = nullptr;
}

void DestroyIdCqs(IdPriv* p) {
  if (p->id.recv_cq_channel == p->id.send_cq_channel) p->id.send_cq_channel = nullptr;
  if (p->id.recv_cq == p->id.send_cq) p->id.send_cq = nullptr;
  DestroyCq(&p->id.send_cq_channel, &p->id.send_cq);
  DestroyCq(&p->id.recv_cq_channel, &p->id.recv_cq);
}

ibv_xrcd* DefaultXrcd(Lib& lib) {
  if (lib.default_xrcd == nullptr) {
    ibv_xrcd_init_attr a{};
    a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    a.fd = -1;
    a.oflags = O_CREAT;
    lib.default_xrcd = ibv_open_xrcd(lib.verbs, &a);
  }
  return lib.default_xrcd;
}

}  // namespace

extern "C" {

int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
  if (id == nullptr || attr == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::lock_guard lock(lib->mu);
  if (id->qp != nullptr || id->verbs == nullptr) return Errno(EINVAL);
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_PD) && attr->pd && attr->pd->context != id->verbs) return Errno(EINVAL);
  if ((id->send_cq && attr->send_cq && attr->send_cq != id->send_cq) ||
      (id->recv_cq && attr->recv_cq && attr->recv_cq != id->recv_cq))
    return Errno(EINVAL);
  if (attr->qp_type == IBV_QPT_XRC_RECV) {
    ibv_xrcd* xrcd = DefaultXrcd(*lib);
    if (xrcd == nullptr) return -1;
    attr->xrcd = xrcd;
    attr->comp_mask |= IBV_QP_INIT_ATTR_XRCD;
  }
  // Missing CQs are made here, one per direction, sized by the queue (ucma_create_cqs).
  bool made_send = false, made_recv = false;
  if (attr->qp_type != IBV_QPT_XRC_RECV) {
    if (!attr->send_cq && !id->send_cq) {
      if (const int err = CreateCq(p, attr->cap.max_send_wr, &id->send_cq_channel, &id->send_cq)) return Errno(err);
      made_send = true;
    }
    if (!attr->recv_cq && !id->recv_cq && attr->qp_type != IBV_QPT_XRC_SEND) {
      if (const int err = CreateCq(p, attr->cap.max_recv_wr, &id->recv_cq_channel, &id->recv_cq)) {
        if (made_send) DestroyCq(&id->send_cq_channel, &id->send_cq);
        return Errno(err);
      }
      made_recv = true;
    }
    if (!attr->send_cq) attr->send_cq = id->send_cq;
    if (!attr->recv_cq) attr->recv_cq = id->recv_cq ? id->recv_cq : id->send_cq;
  }
  if (!attr->srq && id->srq && attr->qp_type != IBV_QPT_XRC_SEND) attr->srq = id->srq;
  ibv_qp* qp = ibv_create_qp_ex(id->verbs, attr);
  if (qp == nullptr) {
    const int err = errno;
    if (made_send) DestroyCq(&id->send_cq_channel, &id->send_cq);
    if (made_recv) DestroyCq(&id->recv_cq_channel, &id->recv_cq);
    return Errno(err);
  }
  id->qp = qp;
  // UD ids go to RTS at once (qkey RDMA_UDP_QKEY); connected ones to INIT, the rest happens at connect/accept.
  ibv_qp_attr a{};
  int mask = 0;
  int err = 0;
  for (ibv_qp_state s : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
    a = {};
    a.qp_state = s;
    err = InitQpAttr(*lib, p, &a, &mask);
    if (err == 0) err = ibv_modify_qp(qp, &a, mask);
    if (err) break;
    if (attr->qp_type != IBV_QPT_UD) break;
  }
  if (err) {
    ibv_destroy_qp(qp);
    id->qp = nullptr;
    if (made_send) DestroyCq(&id->send_cq_channel, &id->send_cq);
    if (made_recv) DestroyCq(&id->recv_cq_channel, &id->recv_cq);
    return Errno(err);
  }
  id->pd = qp->pd ? qp->pd : id->pd;
  return 0;
}

int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (id == nullptr || qp_init_attr == nullptr) return Errno(EINVAL);
  ibv_qp_init_attr_ex ex{};
  std::memcpy(&ex, qp_init_attr, sizeof *qp_init_attr);
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd ? pd : id->pd;
  if (qp_init_attr->qp_type == IBV_QPT_XRC_RECV) {
    ex.comp_mask = 0;
    ex.pd = nullptr;
  }
  if (const int rc = rdma_create_qp_ex(id, &ex); rc != 0) return rc;
  std::memcpy(qp_init_attr, &ex, sizeof *qp_init_attr);
  return 0;
}

void rdma_destroy_qp(rdma_cm_id* id) {
  if (id == nullptr) return;
  if (id->qp) ibv_destroy_qp(id->qp);
  id->qp = nullptr;
  // The CQs this id holds go with it (rsockets puts its own here too), except an XRC SRQ's, which rdma_destroy_srq
  // frees.
  if (!(id->qp_type == IBV_QPT_XRC_RECV && id->srq)) DestroyIdCqs(Priv(id));
}

int rdma_create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
  if (id == nullptr || attr == nullptr) return Errno(EINVAL);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::lock_guard lock(lib->mu);
  if (id->srq != nullptr || id->verbs == nullptr) return Errno(EINVAL);  // one SRQ per id (rdma_create_srq(3))
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || attr->pd == nullptr) {
    attr->pd = id->pd ? id->pd : lib->default_pd;
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
  }
  bool made_cq = false;
  if (attr->srq_type == IBV_SRQT_XRC) {
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || attr->xrcd == nullptr) {
      attr->xrcd = DefaultXrcd(*lib);
      if (attr->xrcd == nullptr) return -1;
      attr->comp_mask |= IBV_SRQ_INIT_ATTR_XRCD;
    }
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || attr->cq == nullptr) {
      // The XRC SRQ's completions land on a CQ made here, exposed as the id's receive CQ.
      ibv_comp_channel* ch = nullptr;
      ibv_cq* cq = nullptr;
      if (const int err = CreateCq(p, attr->attr.max_wr, &ch, &cq)) return Errno(err);
      id->recv_cq_channel = ch;
      id->recv_cq = cq;
      attr->cq = cq;
      attr->comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
      made_cq = true;
    }
  }
  ibv_srq* srq = ibv_create_srq_ex(id->verbs, attr);
  if (srq == nullptr) {
    const int err = errno;
    if (made_cq) DestroyCq(&id->recv_cq_channel, &id->recv_cq);
    return Errno(err);
  }
  id->srq = srq;
  if (id->pd == nullptr) id->pd = attr->pd;
  return 0;
}

int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (id == nullptr || attr == nullptr) return Errno(EINVAL);
  ibv_srq_init_attr_ex ex{};
  ex.srq_context = attr->srq_context;
  ex.attr = attr->attr;
  ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE;
  ex.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
  if (pd) {
    ex.pd = pd;
    ex.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
  }
  if (const int rc = rdma_create_srq_ex(id, &ex); rc != 0) return rc;
  attr->attr = ex.attr;
  return 0;
}

void rdma_destroy_srq(rdma_cm_id* id) {
  if (id == nullptr || id->srq == nullptr) return;
  ibv_destroy_srq(id->srq);
  id->srq = nullptr;
  if (id->qp_type == IBV_QPT_XRC_RECV) DestroyCq(&id->recv_cq_channel, &id->recv_cq);
}

int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (id == nullptr || res == nullptr) return Errno(EINVAL);
  rdma_cm_id* cm = nullptr;
  if (rdma_create_id(nullptr, &cm, nullptr, static_cast<rdma_port_space>(res->ai_port_space)) != 0) return -1;
  IdPriv* p = Priv(cm);
  p->id.qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
  int rc = 0;
  if (res->ai_flags & RAI_PASSIVE) {
    rc = rdma_bind_addr(cm, res->ai_src_addr);
    if (rc == 0) {
      Lib* lib = GetLib();
      std::lock_guard lock(lib->mu);
      if (pd) {
        p->ep_pd = pd;
        p->id.pd = pd;
      }
      if (qp_init_attr) {
        p->ep_qp_attr = std::make_unique<ibv_qp_init_attr>(*qp_init_attr);
        p->ep_qp_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
      }
      *id = cm;
      return 0;
    }
  } else {
    rc = rdma_resolve_addr(cm, res->ai_src_len ? res->ai_src_addr : nullptr, res->ai_dst_addr, 2000);
    if (rc == 0) rc = rdma_resolve_route(cm, 2000);
    if (rc == 0 && qp_init_attr) {
      qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
      rc = rdma_create_qp(cm, pd, qp_init_attr);
    }
    if (rc == 0 && res->ai_connect_len) {
      const auto* b = static_cast<const uint8_t*>(res->ai_connect);
      p->connect_prefix.assign(b, b + res->ai_connect_len);
    }
    if (rc == 0) {
      *id = cm;
      return 0;
    }
  }
  const int err = errno;
  rdma_destroy_ep(cm);
  return Errno(err);
}

void rdma_destroy_ep(rdma_cm_id* id) {
  if (id == nullptr) return;
  if (id->qp) rdma_destroy_qp(id);
  if (id->srq) rdma_destroy_srq(id);
  rdma_destroy_id(id);
}

// --- rdma_getaddrinfo (librdmacm's addrinfo.c semantics: getaddrinfo's EAI_* codes pass through) -------------

int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo** res) {
  if (res == nullptr || (node == nullptr && service == nullptr && hints == nullptr)) return Errno(EINVAL);
  auto* r = static_cast<rdma_addrinfo*>(calloc(1, sizeof(rdma_addrinfo)));
  if (r == nullptr) return Errno(ENOMEM);
  if (hints) {
    r->ai_flags = hints->ai_flags;
    r->ai_family = hints->ai_family;
    r->ai_qp_type = hints->ai_qp_type;
    r->ai_port_space = hints->ai_port_space;
  }
  if (node || service) {
    addrinfo h{};
    addrinfo* ai = nullptr;
    if (hints) {
      if (hints->ai_flags & RAI_PASSIVE) h.ai_flags |= AI_PASSIVE;
      if (hints->ai_flags & RAI_NUMERICHOST) h.ai_flags |= AI_NUMERICHOST;
      if (hints->ai_family != AF_IB) h.ai_family = hints->ai_family;
      const bool dgram = hints->ai_qp_type == IBV_QPT_UD || hints->ai_port_space == RDMA_PS_UDP ||
                         hints->ai_port_space == RDMA_PS_IPOIB;
      h.ai_socktype = dgram ? SOCK_DGRAM : SOCK_STREAM;
      if (hints->ai_port_space == RDMA_PS_TCP) h.ai_protocol = IPPROTO_TCP;
      if (hints->ai_port_space == RDMA_PS_UDP) h.ai_protocol = IPPROTO_UDP;
    } else {
      h.ai_socktype = SOCK_STREAM;
    }
    const int ret = getaddrinfo(node, service, &h, &ai);
    if (ret != 0) {
      free(r);
      return ret;
    }
    // Only the first result is used (ucma_convert_to_rai).
    if (!r->ai_qp_type) r->ai_qp_type = ai->ai_socktype == SOCK_DGRAM ? IBV_QPT_UD : IBV_QPT_RC;
    if (!r->ai_port_space) r->ai_port_space = ai->ai_protocol == IPPROTO_UDP ? RDMA_PS_UDP : RDMA_PS_TCP;
    r->ai_family = ai->ai_family;
    auto* addr = static_cast<sockaddr*>(malloc(ai->ai_addrlen));
    if (addr == nullptr) {
      freeaddrinfo(ai);
      free(r);
      return Errno(ENOMEM);
    }
    std::memcpy(addr, ai->ai_addr, ai->ai_addrlen);
    if (r->ai_flags & RAI_PASSIVE) {
      r->ai_src_addr = addr;
      r->ai_src_len = ai->ai_addrlen;
    } else {
      r->ai_dst_addr = addr;
      r->ai_dst_len = ai->ai_addrlen;
    }
    if (ai->ai_canonname) {
      char* name = strdup(ai->ai_canonname);
      if (r->ai_flags & RAI_PASSIVE)
        r->ai_src_canonname = name;
      else
        r->ai_dst_canonname = name;
    }
    freeaddrinfo(ai);
  } else if (hints && hints->ai_dst_len) {
    r->ai_dst_addr = static_cast<sockaddr*>(malloc(hints->ai_dst_len));
    if (r->ai_dst_addr) {
      std::memcpy(r->ai_dst_addr, hints->ai_dst_addr, hints->ai_dst_len);
      r->ai_dst_len = hints->ai_dst_len;
    }
  }
  if (hints && hints->ai_src_len && r->ai_src_addr == nullptr) {
    r->ai_src_addr = static_cast<sockaddr*>(malloc(hints->ai_src_len));
    if (r->ai_src_addr) {
      std::memcpy(r->ai_src_addr, hints->ai_src_addr, hints->ai_src_len);
      r->ai_src_len = hints->ai_src_len;
    }
  }
  *res = r;
  return 0;
}

void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    free(res->ai_src_addr);
    free(res->ai_dst_addr);
    free(res->ai_src_canonname);
    free(res->ai_dst_canonname);
    free(res->ai_route);
    free(res->ai_connect);
    free(res);
    res = next;
  }
}

// --- UD multicast (RoCEv2: an IP multicast group; no SA, the join completes locally as the kernel's
// cma_iboe_join_multicast) ---------------------------------------------------------------------------------------

int rdma_join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* mc_join_attr, void* context) {
  if (id == nullptr || mc_join_attr == nullptr) return Errno(EINVAL);
  if (mc_join_attr->comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED) return Errno(ENOTSUP);
  if (!(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) || mc_join_attr->addr == nullptr)
    return Errno(EINVAL);
  if (!(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) ||
      mc_join_attr->join_flags >= RDMA_MC_JOIN_FLAG_RESERVED)
    return Errno(EINVAL);
  const sockaddr* addr = mc_join_attr->addr;
  const auto ip = wire::IpAddressOf(addr);
  if (!ip) return Errno(EINVAL);
  if (!ip->is_v4()) return Errno(EOPNOTSUPP);  // IPv6 groups are not supported on RoCEv2 (cma_iboe_join_multicast)
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::unique_lock lock(lib->mu);
  if (id->verbs == nullptr) return Errno(EINVAL);
  auto* m = new Multicast;
  m->id = p;
  m->context = context;
  std::memcpy(&m->addr, addr, SockaddrLen(addr));
  m->mgid = ip->bytes();  // ::ffff:a.b.c.d
  const bool send_only = mc_join_attr->join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
  if (!send_only && id->qp) {
    ibv_gid g;
    std::memcpy(g.raw, m->mgid.data(), 16);
    if (ibv_attach_mcast(id->qp, &g, 0) != 0) {
      const int err = errno;
      delete m;
      return Errno(err);
    }
    m->attached = true;
  }
  p->multicasts.push_back(m);
  Event* e = NewEvent(p, RDMA_CM_EVENT_MULTICAST_JOIN, 0);
  rdma_ud_param& ud = e->event.param.ud;
  ud.private_data = context;  // the join's context, as librdmacm reports it
  ud.ah_attr.is_global = 1;
  std::memcpy(ud.ah_attr.grh.dgid.raw, m->mgid.data(), 16);
  ud.ah_attr.grh.sgid_index = p->sgid_index;
  ud.ah_attr.grh.hop_limit = kHopLimit;
  ud.ah_attr.port_num = 1;
  ud.qp_num = 0xFFFFFF;
  ud.qkey = RDMA_UDP_QKEY;
  Enqueue(*lib, p->channel, e);
  return 0;
}

int rdma_join_multicast(rdma_cm_id* id, sockaddr* addr, void* context) {
  rdma_cm_join_mc_attr_ex a{};
  a.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  a.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
  a.addr = addr;
  return rdma_join_multicast_ex(id, &a, context);
}

int rdma_leave_multicast(rdma_cm_id* id, sockaddr* addr) {
  if (id == nullptr || addr == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::lock_guard lock(lib->mu);
  for (auto it = p->multicasts.begin(); it != p->multicasts.end(); ++it) {
    Multicast* m = *it;
    if (std::memcmp(&m->addr, addr, SockaddrLen(addr)) != 0) continue;
    if (m->attached && id->qp) {
      ibv_gid g;
      std::memcpy(g.raw, m->mgid.data(), 16);
      ibv_detach_mcast(id->qp, &g, 0);
    }
    p->multicasts.erase(it);
    delete m;
    return 0;
  }
  return Errno(EADDRNOTAVAIL);
}

}  // extern "C"
