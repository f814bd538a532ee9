// rsockets (rsocket(7)) are not implemented: rsocket() fails with EOPNOTSUPP, so no descriptor is ever an rsocket,
// and every call taking one answers as rsockets does for a descriptor it does not know (EBADF). rpoll and rselect
// take ordinary descriptors too: with no rsockets they are poll(2) and select(2), which is what the rdmacm-utils
// examples (common.c's do_poll) use them for. README's support table lists rsockets as unsupported.
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/select.h>

#include <cerrno>

namespace {
template <typename R = int>
R BadDescriptor() {
  errno = EBADF;
  return static_cast<R>(-1);
}
}  // namespace

extern "C" {

int rsocket(int, int, int) {
  errno = EOPNOTSUPP;
  return -1;
}
int rbind(int, const sockaddr*, socklen_t) { return BadDescriptor(); }
int rlisten(int, int) { return BadDescriptor(); }
int raccept(int, sockaddr*, socklen_t*) { return BadDescriptor(); }
int rconnect(int, const sockaddr*, socklen_t) { return BadDescriptor(); }
int rshutdown(int, int) { return BadDescriptor(); }
int rclose(int) { return BadDescriptor(); }
ssize_t rrecv(int, void*, size_t, int) { return BadDescriptor<ssize_t>(); }
ssize_t rrecvfrom(int, void*, size_t, int, sockaddr*, socklen_t*) { return BadDescriptor<ssize_t>(); }
ssize_t rrecvmsg(int, msghdr*, int) { return BadDescriptor<ssize_t>(); }
ssize_t rsend(int, const void*, size_t, int) { return BadDescriptor<ssize_t>(); }
ssize_t rsendto(int, const void*, size_t, int, const sockaddr*, socklen_t) { return BadDescriptor<ssize_t>(); }
ssize_t rsendmsg(int, const msghdr*, int) { return BadDescriptor<ssize_t>(); }
ssize_t rread(int, void*, size_t) { return BadDescriptor<ssize_t>(); }
ssize_t rreadv(int, const iovec*, int) { return BadDescriptor<ssize_t>(); }
ssize_t rwrite(int, const void*, size_t) { return BadDescriptor<ssize_t>(); }
ssize_t rwritev(int, const iovec*, int) { return BadDescriptor<ssize_t>(); }
int rpoll(pollfd* fds, nfds_t nfds, int timeout) { return poll(fds, nfds, timeout); }
int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  return select(nfds, readfds, writefds, exceptfds, timeout);
}
int rgetpeername(int, sockaddr*, socklen_t*) { return BadDescriptor(); }
int rgetsockname(int, sockaddr*, socklen_t*) { return BadDescriptor(); }
int rsetsockopt(int, int, int, const void*, socklen_t) { return BadDescriptor(); }
int rgetsockopt(int, int, int, void*, socklen_t*) { return BadDescriptor(); }
int rfcntl(int, int, ...) { return BadDescriptor(); }
off_t riomap(int, void*, size_t, int, int, off_t) { return BadDescriptor<off_t>(); }
int riounmap(int, void*, size_t) { return BadDescriptor(); }
size_t riowrite(int, const void*, size_t, off_t, int) {
  errno = EBADF;
  return 0;
}

}  // extern "C"
