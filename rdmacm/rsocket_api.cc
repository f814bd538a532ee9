// The exported r* functions of rsockets (rsocket(3)), and the table of rsockets by descriptor (rsocket.h).
// rpoll and rselect take ordinary descriptors as poll(2) and select(2) do; rdmacm-utils' common code uses them so.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <rdma/rsocket.h>
#include <sys/eventfd.h>
#include <sys/select.h>

#include <algorithm>
#include <cstdarg>
#include <cstring>

#include "rdmacm/internal.h"
#include "rdmacm/rsocket.h"

using namespace uroce::rdmacm;
using namespace uroce::rdmacm::rsockets;

namespace {

// The table: the only state of rsockets shared between them (rsocket.h, "Locking").
std::mutex g_table_mu;
std::map<int, std::shared_ptr<RSocket>> g_sockets;  // guarded by g_table_mu

// An rsocket of the table with its lock held; empty when the descriptor is none of ours or was closed.
struct Locked {
  std::shared_ptr<RSocket> rs;
  std::unique_lock<std::mutex> lock;
  explicit operator bool() const { return rs != nullptr; }
  RSocket* operator->() const { return rs.get(); }
  RSocket* get() const { return rs.get(); }
};

Locked Acquire(int fd) {
  Locked l{Lookup(fd), {}};
  if (!l.rs) return l;
  l.lock = std::unique_lock(l.rs->mu);
  if (l.rs->closed) return {};  // rclose took it meanwhile
  return l;
}

int Insert(std::shared_ptr<RSocket> rs) {
  const int fd = rs->fd;
  std::lock_guard lock(g_table_mu);
  g_sockets[fd] = std::move(rs);
  return fd;
}

std::shared_ptr<RSocket> TakeOut(int fd) {
  std::lock_guard lock(g_table_mu);
  auto it = g_sockets.find(fd);
  if (it == g_sockets.end()) return nullptr;
  std::shared_ptr<RSocket> rs = std::move(it->second);
  g_sockets.erase(it);
  return rs;
}

// getsockname(2)'s contract for rgetsockname / rgetpeername: the address is cut to *addrlen bytes (none with a
// length of 0, when `addr` may be NULL: librspreload asks the size that way before it turns an rsocket whose
// rconnect failed into a TCP socket) and *addrlen says its full size. An unbound socket reads as its family's any
// address, port 0. 0 or EFAULT.
int CopyOutAddress(const sockaddr_storage& from, int family, sockaddr* addr, socklen_t* addrlen) {
  if (addrlen == nullptr || (addr == nullptr && *addrlen > 0)) return EFAULT;
  sockaddr_storage a = from;
  if (a.ss_family == AF_UNSPEC) a.ss_family = sa_family_t(family);
  const socklen_t size = a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (*addrlen > 0) std::memcpy(addr, &a, std::min(*addrlen, size));
  *addrlen = size;
  return 0;
}

ssize_t Send(int fd, const void* buf, size_t len, int flags, const sockaddr* dst = nullptr) {
  Locked rs = Acquire(fd);
  if (!rs) return Fail<ssize_t>(EBADF);
  if (!rs->dgram) return StreamSend(rs.get(), rs.lock, buf, len, flags);
  if (dst == nullptr && rs->datagram.peer) dst = reinterpret_cast<const sockaddr*>(&*rs->datagram.peer);
  return DgramSend(rs.get(), rs.lock, buf, len, flags, dst);
}

ssize_t Recv(int fd, void* buf, size_t len, int flags, sockaddr* src = nullptr, socklen_t* srclen = nullptr) {
  Locked rs = Acquire(fd);
  if (!rs) return Fail<ssize_t>(EBADF);
  if (rs->dgram) return DgramRecv(rs.get(), rs.lock, buf, len, flags, src, srclen);
  return StreamRecv(rs.get(), rs.lock, buf, len, flags);
}

// readv/writev over Recv and Send. A read fills the buffers in order and stops at the first one left short (what
// was ready is read; MSG_WAITALL waits for all of it); a write sends every buffer, blocking for each as Send does on
// a blocking socket, and stops at the first short one on a non-blocking socket or with MSG_DONTWAIT.
ssize_t ReadV(int socket, const iovec* iov, int iovcnt, int flags) {
  ssize_t total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    const int f = i == 0 || (flags & MSG_WAITALL) ? flags : flags | MSG_DONTWAIT;
    const ssize_t n = Recv(socket, iov[i].iov_base, iov[i].iov_len, f);
    if (n < 0) return total ? total : n;
    total += n;
    if (size_t(n) < iov[i].iov_len) break;
  }
  return total;
}

ssize_t WriteV(int socket, const iovec* iov, int iovcnt, int flags) {
  ssize_t total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    const ssize_t n = Send(socket, iov[i].iov_base, iov[i].iov_len, flags);
    if (n < 0) return total ? total : n;
    total += n;
    if (size_t(n) < iov[i].iov_len) break;
  }
  return total;
}

bool KnownOption(int level, int optname) {
  return (level == SOL_SOCKET && (optname == SO_REUSEADDR || optname == SO_SNDBUF || optname == SO_RCVBUF ||
                                  optname == SO_KEEPALIVE || optname == SO_LINGER || optname == SO_OOBINLINE)) ||
         (level == IPPROTO_TCP && (optname == TCP_NODELAY || optname == TCP_KEEPIDLE || optname == TCP_MAXSEG)) ||
         (level == SOL_RDMA && optname >= RDMA_SQSIZE && optname <= RDMA_ROUTE);
}

}  // namespace

std::shared_ptr<RSocket> uroce::rdmacm::rsockets::Lookup(int fd) {
  std::lock_guard lock(g_table_mu);
  auto it = g_sockets.find(fd);
  return it == g_sockets.end() ? nullptr : it->second;
}

extern "C" {

int rsocket(int domain, int type, int protocol) {
  if (domain != AF_INET && domain != AF_INET6) return Fail(EAFNOSUPPORT);
  if (protocol != 0 && protocol != IPPROTO_TCP && protocol != IPPROTO_UDP) return Fail(EPROTONOSUPPORT);
  const int kind = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (kind != SOCK_STREAM && kind != SOCK_DGRAM) return Fail(EOPNOTSUPP);
  if ((protocol == IPPROTO_TCP && kind != SOCK_STREAM) || (protocol == IPPROTO_UDP && kind != SOCK_DGRAM))
    return Fail(EPROTONOSUPPORT);
  auto rs = std::make_shared<RSocket>(kind == SOCK_DGRAM);
  rs->fd = eventfd(0, EFD_CLOEXEC);
  if (rs->fd < 0) return -1;
  rs->family = domain;
  rs->nonblocking = type & SOCK_NONBLOCK;
  if (rs->dgram) {
    if (int err = DgramSetUp(rs.get())) {
      DgramTearDown(rs.get());
      close(rs->fd);
      return Fail(err);
    }
  }
  return Insert(std::move(rs));
}

int rbind(int socket, const sockaddr* addr, socklen_t addrlen) {
  Locked rs = Acquire(socket);
  if (!rs) return Fail(EBADF);
  if (addr == nullptr || addrlen > sizeof rs->bound) return Fail(EINVAL);
  std::memcpy(&rs->bound, addr, addrlen);
  rs->has_bound = true;
  if (rs->dgram)
    if (int err = DgramBind(rs.get(), addr)) return Fail(err);
  return 0;
}

int rlisten(int socket, int backlog) {
  Locked rs = Acquire(socket);
  if (!rs) return Fail(EBADF);
  if (rs->dgram) return Fail(EOPNOTSUPP);  // as listen(2) on a UDP socket
  return StreamListen(rs.get(), backlog);
}

int raccept(int socket, sockaddr* addr, socklen_t* addrlen) {
  Locked ls = Acquire(socket);
  if (!ls) return Fail(EBADF);
  if (!ls->stream.listening) return Fail(EINVAL);
  std::shared_ptr<RSocket> rs = StreamAccept(ls.get(), ls.lock);
  if (rs == nullptr) return -1;
  ls.lock.unlock();
  if (addr && addrlen) CopyOutAddress(rs->stream.id->route.addr.dst_storage, rs->family, addr, addrlen);
  return Insert(std::move(rs));
}

int rconnect(int socket, const sockaddr* addr, socklen_t addrlen) {
  Locked rs = Acquire(socket);
  if (!rs) return Fail(EBADF);
  if (rs->stream.connected || rs->stream.listening) return Fail(EISCONN);
  if (addr == nullptr || addrlen < sizeof(sockaddr_in)) return Fail(EINVAL);
  const int err = rs->dgram ? DgramConnect(rs.get(), addr, addrlen) : StreamConnect(rs.get(), rs.lock, addr, addrlen);
  return err ? Fail(err) : 0;
}

int rshutdown(int socket, int how) {
  Locked rs = Acquire(socket);
  if (!rs) return Fail(EBADF);
  const int err = StreamShutdown(rs.get(), rs.lock, how);
  return err ? Fail(err) : 0;
}

int rclose(int socket) {
  std::shared_ptr<RSocket> rs = TakeOut(socket);
  if (rs == nullptr) return Fail(EBADF);
  std::unique_lock lock(rs->mu);
  rs->closed = true;  // a call that found it before still fails with EBADF
  // Threads blocked on it leave first, failing with EBADF: its resources are freed below. (A recv(2) blocked on a
  // descriptor another thread closes goes on waiting; here it would wait on what is about to be gone.)
  LetWaitersGo(rs.get(), lock);
  if (rs->dgram) {
    DgramTearDown(rs.get());
  } else {
    StreamClose(rs.get(), lock);
  }
  close(rs->fd);
  return 0;
}

ssize_t rrecv(int socket, void* buf, size_t len, int flags) { return Recv(socket, buf, len, flags); }
ssize_t rsend(int socket, const void* buf, size_t len, int flags) { return Send(socket, buf, len, flags); }
ssize_t rread(int socket, void* buf, size_t count) { return Recv(socket, buf, count, 0); }
ssize_t rwrite(int socket, const void* buf, size_t count) { return Send(socket, buf, count, 0); }
ssize_t rreadv(int socket, const iovec* iov, int iovcnt) { return ReadV(socket, iov, iovcnt, 0); }
ssize_t rwritev(int socket, const iovec* iov, int iovcnt) { return WriteV(socket, iov, iovcnt, 0); }

ssize_t rrecvmsg(int socket, msghdr* msg, int flags) {
  if (msg == nullptr) return Fail<ssize_t>(EINVAL);
  return ReadV(socket, msg->msg_iov, int(msg->msg_iovlen), flags);
}

ssize_t rsendmsg(int socket, const msghdr* msg, int flags) {
  if (msg == nullptr) return Fail<ssize_t>(EINVAL);
  return WriteV(socket, msg->msg_iov, int(msg->msg_iovlen), flags);
}

ssize_t rrecvfrom(int socket, void* buf, size_t len, int flags, sockaddr* src_addr, socklen_t* addrlen) {
  return Recv(socket, buf, len, flags, src_addr, addrlen);  // a stream leaves the address alone
}

ssize_t rsendto(int socket, const void* buf, size_t len, int flags, const sockaddr* dest_addr, socklen_t) {
  return Send(socket, buf, len, flags, dest_addr);  // a stream ignores the address, as TCP
}

int rpoll(pollfd* fds, nfds_t nfds, int timeout) { return Rpoll(fds, nfds, timeout); }

int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  return select(nfds, readfds, writefds, exceptfds, timeout);
}

int rgetpeername(int socket, sockaddr* addr, socklen_t* addrlen) {
  Locked rs = Acquire(socket);
  if (!rs) return Fail(EBADF);
  if (!rs->stream.connected) return Fail(ENOTCONN);
  if (int err = CopyOutAddress(rs->stream.id->route.addr.dst_storage, rs->family, addr, addrlen)) return Fail(err);
  return 0;
}

int rgetsockname(int socket, sockaddr* addr, socklen_t* addrlen) {
  Locked rs = Acquire(socket);
  if (!rs) return Fail(EBADF);
  sockaddr_storage ss{};
  if (rs->dgram)
    SetSockaddr(&ss, rs->datagram.device, rs->datagram.binding.port(), rs->family);
  else
    ss = rs->stream.id ? rs->stream.id->route.addr.src_storage : rs->bound;
  if (int err = CopyOutAddress(ss, rs->family, addr, addrlen)) return Fail(err);
  return 0;
}

int rsetsockopt(int socket, int level, int optname, const void* optval, socklen_t optlen) {
  Locked rs = Acquire(socket);
  if (!rs) return Fail(EBADF);
  if (!KnownOption(level, optname)) return Fail(ENOPROTOOPT);
  // Buffers and queues have fixed sizes here; the values are kept for rgetsockopt.
  if (optval != nullptr && optlen >= sizeof(int)) rs->options[{level, optname}] = *static_cast<const int*>(optval);
  return 0;
}

int rgetsockopt(int socket, int level, int optname, void* optval, socklen_t* optlen) {
  Locked rs = Acquire(socket);
  if (!rs) return Fail(EBADF);
  if (optval == nullptr || optlen == nullptr || *optlen < sizeof(int)) return Fail(EINVAL);
  int value = 0;
  if (level == SOL_SOCKET && optname == SO_ERROR) {
    value = rs->error;
    rs->error = 0;
  } else if (auto it = rs->options.find({level, optname}); it != rs->options.end()) {
    value = it->second;
  } else if (level == SOL_SOCKET && (optname == SO_SNDBUF || optname == SO_RCVBUF)) {
    value = int(rs->slots * rs->slot_bytes);
  } else if (!(level == SOL_SOCKET || level == IPPROTO_TCP || level == SOL_RDMA)) {
    return Fail(ENOPROTOOPT);
  }
  *static_cast<int*>(optval) = value;
  *optlen = sizeof(int);
  return 0;
}

int rfcntl(int socket, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  const long arg = cmd == F_SETFL ? va_arg(ap, long) : 0;
  va_end(ap);
  Locked rs = Acquire(socket);
  if (!rs) return Fail(EBADF);
  switch (cmd) {
    case F_GETFL:
      return O_RDWR | (rs->nonblocking ? O_NONBLOCK : 0);
    case F_SETFL:
      rs->nonblocking = arg & O_NONBLOCK;
      return 0;
    default:
      return Fail(EINVAL);
  }
}

off_t riomap(int socket, void* buf, size_t len, int prot, int flags, off_t offset) {
  (void)flags;
  Locked rs = Acquire(socket);
  if (!rs) return Fail<off_t>(EBADF);
  return StreamIomap(rs.get(), rs.lock, buf, len, prot, offset);
}

int riounmap(int socket, void* buf, size_t len) {
  (void)len;
  Locked rs = Acquire(socket);
  if (!rs) return Fail(EBADF);
  const int err = StreamIounmap(rs.get(), buf);
  return err ? Fail(err) : 0;
}

size_t riowrite(int socket, const void* buf, size_t count, off_t offset, int flags) {
  Locked rs = Acquire(socket);
  if (!rs) return Fail<size_t>(EBADF);
  return StreamIowrite(rs.get(), rs.lock, buf, count, offset, flags);
}

}  // extern "C"
