// Event channels: a FIFO of events per channel and an eventfd readable exactly while the FIFO is not empty, so that
// poll(2)/epoll see it and a non-blocking fd (O_NONBLOCK set by the application with fcntl) gets EAGAIN instead of
// blocking (the kernel's ucma_poll / ucma_get_event).
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "rdmacm/internal.h"

namespace uroce::rdmacm {

int OpenChannelFd(Channel* ch) {
  const int fd = eventfd(0, EFD_CLOEXEC);
  if (fd < 0) return errno;
  ch->channel.fd = fd;
  return 0;
}

static void Signal(Channel* ch) {
  if (ch->signalled) return;
  const uint64_t one = 1;
  if (write(ch->channel.fd, &one, sizeof one) == sizeof one) ch->signalled = true;
}

void ClearSignal(Channel* ch) {
  if (!ch->signalled) return;
  // The count is non-zero, so this read cannot block whatever O_NONBLOCK says.
  uint64_t v;
  if (read(ch->channel.fd, &v, sizeof v) == sizeof v) ch->signalled = false;
}

void Enqueue(Lib& lib, Channel* ch, Event* ev) {
  ch->queue.push_back(ev);
  Signal(ch);
  lib.cv.notify_all();
}

std::vector<Event*> RemoveQueued(Channel* ch, IdPriv* id) {
  std::vector<Event*> out;
  for (auto it = ch->queue.begin(); it != ch->queue.end();) {
    Event* e = *it;
    if (e->owner == id || e->event.id == &id->id) {
      out.push_back(e);
      it = ch->queue.erase(it);
    } else {
      ++it;
    }
  }
  if (ch->queue.empty()) ClearSignal(ch);
  return out;
}

int PopEvent(Lib& lib, std::unique_lock<std::mutex>& lock, Channel* ch, Event** out) {
  (void)lib;
  for (;;) {
    if (!ch->queue.empty()) {
      *out = ch->queue.front();
      ch->queue.pop_front();
      if (ch->queue.empty()) ClearSignal(ch);
      return 0;
    }
    const int flags = fcntl(ch->channel.fd, F_GETFL);
    if (flags >= 0 && (flags & O_NONBLOCK)) return EAGAIN;
    const int fd = ch->channel.fd;
    lock.unlock();
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, -1);
    const int err = errno;
    lock.lock();
    if (r < 0 && err != EINTR) return err;
  }
}

}  // namespace uroce::rdmacm
