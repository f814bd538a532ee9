// Blocking on rsockets (rsocket.h): a call that must wait polls the CQ for a while, then sleeps on the CQ's
// completion channel (WaitUntil); several threads blocked on one rsocket share the channel; rclose wakes them; rpoll
// does the same for many rsockets and ordinary descriptors at once.
#include <sys/eventfd.h>

#include "rdmacm/rsocket.h"
#include "wire/event_fd.h"

namespace uroce::rdmacm::rsockets {
namespace {

// How long a blocking call polls before it sleeps. Polling the CQ is what lets the calling thread drive uroce's
// engine: a reply that comes meanwhile is taken at once (a ping-pong's comes within ~10 us), at the price of a CPU;
// past it the thread sleeps on the CQ's completion channel, the engine's progress thread receives and an idle
// connection costs nothing. 50 us is the engine's own polling streak (a poller that looks again within it keeps the
// receive side). rdma-core's rsockets likewise poll for a while (their polling_time) before they sleep.
constexpr auto kPollBeforeSleeping = std::chrono::microseconds(50);

// One turn of a polling loop: tells the core it spins (the other hyperthread gets the pipeline meanwhile).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// poll(2)'s timeout for `deadline`: -1 for none, else the milliseconds left, rounded up (waking early only loops).
int PollTimeoutMs(Deadline deadline) {
  if (deadline == Deadline::max()) return -1;
  const auto left = deadline - std::chrono::steady_clock::now();
  if (left <= Deadline::duration::zero()) return 0;
  return int(std::chrono::ceil<std::chrono::milliseconds>(left).count());
}

// The rsocket's wake_fd, made on first use; -1 (errno set) when no eventfd can be made.
int WakeFd(RSocket* rs) {
  if (rs->wake_fd < 0) rs->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return rs->wake_fd;
}

void DrainWakeFd(RSocket* rs) {
  uint64_t wakes;
  [[maybe_unused]] ssize_t n = read(rs->wake_fd, &wakes, sizeof wakes);
}

// Takes every event the CQ's channel holds, acknowledging each (ibv_destroy_cq waits for that).
void DrainCqEvents(RSocket* rs) {
  if (rs->cq_channel == nullptr) return;
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (ibv_get_cq_event(rs->cq_channel, &cq, &context) == 0) ibv_ack_cq_events(cq, 1);
}

// The descriptor to sleep on until `rs` may have changed: a listener's event channel, else its CQ's completion
// channel with the CQ armed first -- what completes after the arming raises an event, what completed before it
// raises none (ibv_req_notify_cq(3)), so a look at the CQ must follow before the sleep. -1: nothing to sleep on (a
// stream rsocket not connected yet).
int ArmForSleep(RSocket* rs) {
  if (rs->stream.listening) return rs->stream.channel->fd;
  if (rs->cq_channel == nullptr || ibv_req_notify_cq(rs->cq, 0) != 0) return -1;
  return rs->cq_channel->fd;
}

bool Writable(const RSocket* rs) {
  if (rs->error) return rs->stream.connected || rs->dgram;
  if (rs->dgram) return !rs->free_send.empty();
  return rs->stream.connected && !rs->free_send.empty() && HasCreditForData(rs);
}

// Sleeps, with the lock released, on the CQ's completion channel `fd` (armed), the wake_fd and the connection's CM
// channel -- a peer that dies sends nothing the CQ would hear of -- then takes what woke it and lets the other
// waiters look again; one of them sleeps on the channel next.
void SleepOnChannel(RSocket* rs, std::unique_lock<std::mutex>& lock, int fd, Deadline deadline) {
  rs->channel_sleeper = true;
  pollfd p[3] = {{fd, POLLIN, 0}, {rs->wake_fd, POLLIN, 0}, {CmWatchFd(rs), POLLIN, 0}};
  lock.unlock();
  poll(p, 3, PollTimeoutMs(deadline));
  lock.lock();
  rs->channel_sleeper = false;
  DrainWakeFd(rs);
  DrainCqEvents(rs);
  TakeCmEvents(rs);
  rs->changed.notify_all();
}

}  // namespace

bool Readable(const RSocket* rs) {
  return !rs->ready.empty() || rs->peer_fin || rs->error || rs->stream.read_shut;
}

void WakeWaiters(RSocket* rs) {
  if (rs->waiters > 0) rs->changed.notify_all();
  const bool cm_waiters = (rs->stream.listening || rs->stream.connecting) && rs->waiters > 0;
  if (rs->wake_fd >= 0 && (rs->channel_sleeper || cm_waiters)) wire::SignalEventFd(rs->wake_fd);
}

// It polls for kPollBeforeSleeping, then arms the CQ, looks once more and sleeps on the completion channel -- or,
// when another thread blocked on the rsocket sleeps there already, on `changed` (RSocket::waiters).
bool WaitUntil(RSocket* rs, std::unique_lock<std::mutex>& lock, Ready ready, Deadline deadline) {
  const Deadline poll_until = std::chrono::steady_clock::now() + kPollBeforeSleeping;
  ++rs->waiters;
  bool done = true;
  while (!ready()) {
    const Deadline now = std::chrono::steady_clock::now();
    if (now >= deadline || rs->closing) {
      done = false;
      break;
    }
    if (now >= poll_until && rs->channel_sleeper) {
      // That thread signals `changed` when it wakes, as does every thread that takes completions meanwhile.
      if (deadline == Deadline::max()) {
        rs->changed.wait(lock);
      } else {
        rs->changed.wait_until(lock, deadline);
      }
      continue;
    }
    const int fd = now < poll_until ? -1 : ArmForSleep(rs);
    if (fd < 0 || WakeFd(rs) < 0) {
      lock.unlock();  // other calls on this rsocket go on meanwhile
      CpuRelax();
      lock.lock();
      continue;
    }
    TakeCmEvents(rs);
    if (ready()) break;
    SleepOnChannel(rs, lock, fd, deadline);
  }
  if (--rs->waiters == 0 && rs->closing) rs->changed.notify_all();  // rclose waits for that
  return done;
}

int WaitForCmEvent(RSocket* rs, std::unique_lock<std::mutex>& lock) {
  if (WakeFd(rs) < 0) return errno;
  ++rs->waiters;  // WakeWaiters signals wake_fd while a listener or a handshake has waiters
  pollfd p[2] = {{rs->stream.channel->fd, POLLIN, 0}, {rs->wake_fd, POLLIN, 0}};
  lock.unlock();
  poll(p, 2, -1);
  lock.lock();
  const bool closing = rs->closing;
  if (--rs->waiters == 0) {
    DrainWakeFd(rs);
    if (closing) rs->changed.notify_all();
  }
  return closing ? EBADF : 0;
}

int TakeSendSlot(RSocket* rs, std::unique_lock<std::mutex>& lock, bool wait, bool needs_credit) {
  auto can_post = [&] { return !rs->free_send.empty() && (!needs_credit || HasCreditForData(rs)); };
  PollCq(rs);
  if (!can_post() && !rs->error && wait) {
    WaitUntil(rs, lock, [&] {
      PollCq(rs);
      return can_post() || rs->error;
    });
    if (rs->closing) return -EBADF;
  }
  if (rs->error && !rs->dgram) return -rs->error;
  if (!can_post()) return rs->error ? -rs->error : -EAGAIN;
  const int slot = rs->free_send.back();
  rs->free_send.pop_back();
  return slot;
}

void LetWaitersGo(RSocket* rs, std::unique_lock<std::mutex>& lock) {
  if (rs->waiters == 0) return;
  rs->closing = true;
  WakeWaiters(rs);
  rs->changed.wait(lock, [&] { return rs->waiters == 0; });
  rs->closing = false;
}

// --- rpoll ------------------------------------------------------------------------------------------------------

namespace {

// Whether a listener has a connection request waiting (its channel's descriptor is readable).
bool Pending(const RSocket* ls) {
  pollfd p{ls->stream.channel->fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// What rpoll looks at in one pass: the rsockets' events are set in `fds`, the others' are gathered to be polled.
struct RpollPass {
  std::vector<pollfd> others;
  std::vector<nfds_t> other_index;
  std::vector<pollfd> sleep_on;  // when the pass precedes a sleep: the channels of the rsockets
  int look_again_ms = -1;        // a bound on the sleep for rsockets whose changes raise no event rpoll sleeps on
  int ready = 0;
};

// Arms `rs` for the sleep that follows the look (its lock held) and adds what to sleep on.
void PrepareToSleep(RSocket* rs, RpollPass& pass) {
  // A thread blocked on it takes completions rpoll would not hear of (RSocket::waiters): look again soon.
  if (rs->waiters > 0) pass.look_again_ms = 1;
  if (const int fd = ArmForSleep(rs); fd >= 0) {
    pass.sleep_on.push_back({fd, POLLIN, 0});
    TakeCmEvents(rs);
    if (const int cm_fd = CmWatchFd(rs); cm_fd >= 0) pass.sleep_on.push_back({cm_fd, POLLIN, 0});
  } else if (pass.look_again_ms < 0) {
    pass.look_again_ms = 10;  // not connected yet: another thread's rconnect would raise no event
  }
}

// The events of one rsocket, looked at under its lock (armed first when `sleep`).
short LookAt(RSocket* rs, short events, bool sleep, RpollPass& pass) {
  std::lock_guard lock(rs->mu);
  if (rs->closed) return POLLNVAL;  // rclose took it meanwhile, as poll(2) on a closed descriptor
  if (sleep) PrepareToSleep(rs, pass);
  PollCq(rs);
  short revents = 0;
  if (rs->stream.listening) {
    if ((events & POLLIN) && Pending(rs)) revents |= POLLIN;
    return revents;
  }
  if ((events & POLLIN) && Readable(rs)) revents |= POLLIN;
  if ((events & POLLOUT) && Writable(rs)) revents |= POLLOUT;
  if (rs->error) revents |= POLLERR;
  if (rs->peer_fin && rs->stream.fin_sent) revents |= POLLHUP;  // both directions ended, as TCP
  return revents;
}

// One look at every descriptor: the rsockets themselves, the others with poll(2) without waiting.
void LookAtAll(pollfd* fds, nfds_t nfds, bool sleep, RpollPass& pass) {
  for (nfds_t i = 0; i < nfds; ++i) {
    fds[i].revents = 0;
    if (const std::shared_ptr<RSocket> rs = Lookup(fds[i].fd)) {
      fds[i].revents = LookAt(rs.get(), fds[i].events, sleep, pass);
      if (fds[i].revents) ++pass.ready;
    } else {
      pass.others.push_back(fds[i]);
      pass.other_index.push_back(i);
    }
  }
  if (!pass.others.empty() && poll(pass.others.data(), pass.others.size(), 0) > 0) {
    for (size_t k = 0; k < pass.others.size(); ++k) {
      fds[pass.other_index[k]].revents = pass.others[k].revents;
      if (pass.others[k].revents) ++pass.ready;
    }
  }
}

// Sleeps on what the pass gathered, until one stirs, `deadline` or the pass's bound; then takes the rsockets'
// channel events (the CQs' and the connections' CM events).
void SleepOnAll(pollfd* fds, nfds_t nfds, RpollPass& pass, Deadline deadline) {
  pass.sleep_on.insert(pass.sleep_on.end(), pass.others.begin(), pass.others.end());
  const int wait_ms = PollTimeoutMs(deadline);
  const int look_again_ms = pass.look_again_ms;
  poll(pass.sleep_on.data(), pass.sleep_on.size(),
       look_again_ms >= 0 && (wait_ms < 0 || wait_ms > look_again_ms) ? look_again_ms : wait_ms);
  for (nfds_t i = 0; i < nfds; ++i) {
    if (const std::shared_ptr<RSocket> rs = Lookup(fds[i].fd)) {
      std::lock_guard lock(rs->mu);
      if (rs->closed) continue;
      DrainCqEvents(rs.get());
      TakeCmEvents(rs.get());
    }
  }
}

}  // namespace

// Looks at every descriptor, polling for kPollBeforeSleeping (as WaitUntil), then sleeps in poll(2) on the
// ordinary descriptors, the rsockets' completion channels (their CQs armed before the look that precedes the sleep)
// and the listeners' event channels, until one of them stirs or the timeout passes.
int Rpoll(pollfd* fds, nfds_t nfds, int timeout) {
  const Deadline start = std::chrono::steady_clock::now();
  const Deadline deadline = timeout < 0 ? Deadline::max() : start + std::chrono::milliseconds(timeout);
  const Deadline poll_until = start + kPollBeforeSleeping;
  RpollPass pass;
  for (;;) {
    pass.others.clear();
    pass.other_index.clear();
    pass.sleep_on.clear();
    pass.look_again_ms = -1;
    pass.ready = 0;
    const bool sleep = timeout != 0 && std::chrono::steady_clock::now() >= poll_until;
    LookAtAll(fds, nfds, sleep, pass);
    if (pass.ready > 0 || timeout == 0) return pass.ready;
    if (std::chrono::steady_clock::now() >= deadline) return 0;
    if (!sleep) {
      CpuRelax();
      continue;
    }
    SleepOnAll(fds, nfds, pass, deadline);
  }
}

}  // namespace uroce::rdmacm::rsockets
