// Event channels: a FIFO of events per channel and an eventfd readable exactly while the FIFO is not empty, so that
// poll(2)/epoll see it and a non-blocking fd (O_NONBLOCK set by the application with fcntl) gets EAGAIN instead of
// blocking (the kernel's ucma_poll / ucma_get_event).
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "rdmacm/internal.h"
#include "wire/event_fd.h"

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

void DestroyChannelLocked(Channel* ch) {
  if (ch->waiters > 0) {
    ch->destroyed = true;
    wire::SignalEventFd(ch->channel.fd);  // wake the pollers
    return;
  }
  close(ch->channel.fd);
  delete ch;
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
    ++ch->waiters;
    lock.unlock();
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, -1);
    const int err = errno;
    lock.lock();
    --ch->waiters;
    if (ch->destroyed) {
      if (ch->waiters == 0) {
        close(ch->channel.fd);
        delete ch;
      }
      // As with the kernel's channel, whose read(2) stays blocked on a descriptor closed under it: the call never
      // returns. (rping's CM thread is blocked here when its main thread destroys the channel and exits; an error
      // would make that thread exit(2) the process with its own status first.)
      lock.unlock();
      for (;;) pause();
    }
    if (r < 0 && err != EINTR) return err;
  }
}

}  // namespace uroce::rdmacm
