// The objects behind the libibverbs structs we hand out. Each public struct (ibv_context, ibv_cq_ex, ibv_qp_ex, ...)
// is the FIRST member of our wrapper, so a pointer the application gives back converts with a static cast of its
// address (the same trick rdma-core's providers use with container_of).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <type_traits>

#include "emu/device.h"
#include "verbs_api/engine.h"

namespace uroce::verbs {

// An eventfd-backed queue that a file descriptor reports readable while non-empty: completion channels and the
// context's async event fd. The application may make the fd non-blocking and poll(2) it.
template <typename T>
class EventQueue {
 public:
  // At most this many undelivered items: an application that never reads its async events (or a peer that makes
  // them by the million) costs a bounded amount of memory. A completion channel holds at most one event per armed CQ,
  // far fewer than this.
  static constexpr size_t kCapacity = 65536;

  int Open();  // 0 or errno
  void Close();
  int fd() const { return fd_; }
  // False (and the item is dropped and counted) when kCapacity items are already waiting.
  bool Push(const T& item);
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // Blocks (unless the fd is O_NONBLOCK) until an item is available. 0 or errno (EAGAIN when non-blocking and empty).
  // `reported`, if given, runs on the item under the queue's lock: the kernel's count of an object's events handed to
  // the application, which its destroy waits to see acknowledged.
  int Pop(T* item, const std::function<void(const T&)>& reported = {});
  // Withdraws every waiting item `gone` is true for, as the kernel does with the undelivered events of an object it
  // destroys: the application never gets them. Then runs `after` under the same lock, so that it reads the
  // reported count of the object's events as it stands once no more can be handed out. A withdrawn item keeps its
  // unit of the eventfd, which Pop passes over (a reader woken for it finds nothing, as with the kernel's).
  void Withdraw(const std::function<bool(const T&)>& gone, const std::function<void()>& after);

 private:
  struct Entry {
    T item;
    bool withdrawn = false;
  };
  int fd_ = -1;
  std::mutex mu_;
  std::deque<Entry> items_;
  std::atomic<uint64_t> dropped_{0};
};

// Runs `body`, the whole of a verb, and turns an exception into `failed` with errno ENOMEM: allocation is the only
// thing that throws in the library, and no C++ exception may cross the C ABI into a C program (which cannot catch
// it: it would abort).
template <typename R, typename F>
R NoThrow(R failed, F&& body) noexcept {
  try {
    return body();
  } catch (...) {
    errno = ENOMEM;
    return failed;
  }
}

struct Context {
  verbs_context vctx;  // must be first: ibv_context is its last member, and &vctx.context is what we return
  std::shared_ptr<Engine> engine;
  EventQueue<ibv_async_event> async_events;
  // A context ibv_import_device(3) made from another process's cmd_fd: that process's owner number on the host device
  // (PDs imported through this context are its PDs); 0 for a context on our own objects.
  uint8_t imported_owner;
  emu::Device& dev() { return engine->device(); }
};
inline Context* ToContext(ibv_context* c) {
  return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
}
inline Context* Ctx(ibv_context* c) { return ToContext(c); }

// What an async event is about (emu::ElementOf; ibv_event_type numbers AsyncEventType's events alike: qp_verbs.cc).
using emu::EventElement;
static_assert(int(emu::AsyncEventType::kCqErr) == IBV_EVENT_CQ_ERR &&
              int(emu::AsyncEventType::kQpLastWqeReached) == IBV_EVENT_QP_LAST_WQE_REACHED &&
              int(emu::AsyncEventType::kSrqErr) == IBV_EVENT_SRQ_ERR);
inline EventElement ElementOf(ibv_event_type type) { return emu::ElementOf(static_cast<emu::AsyncEventType>(type)); }

// The object an async event names; nullptr for a port or device event.
inline const void* ObjectOf(const ibv_async_event& e) {
  switch (ElementOf(e.event_type)) {
    case EventElement::kQp:
      return e.element.qp;
    case EventElement::kCq:
      return e.element.cq;
    case EventElement::kSrq:
      return e.element.srq;
    case EventElement::kPort:
      break;
  }
  return nullptr;
}

// Destroying a QP, CQ or SRQ (ibv_get_async_event(3), ibv_get_cq_event(3)) withdraws `object`'s events still waiting
// in `events`, and returns how many were handed out: `reported`, read under the queue's lock, once no more can be.
template <typename T>
uint32_t WithdrawEvents(EventQueue<T>& events, const void* object, const uint32_t& reported) {
  uint32_t handed_out = 0;
  events.Withdraw(
      [object](const T& e) {
        if constexpr (std::is_same_v<T, ibv_async_event>) {
          return ObjectOf(e) == object;
        } else {
          return static_cast<const void*>(e) == object;  // a completion channel's events are their CQs
        }
      },
      [&] { handed_out = reported; });
  return handed_out;
}

// ... and waits on the object's mutex and cond until the application has acknowledged `handed_out` of them
// (ibv_ack_async_event, ibv_ack_cq_events): it may still be handling one.
inline void WaitForAcknowledgements(pthread_mutex_t* mu, pthread_cond_t* cond, const unsigned int& completed,
                                    uint32_t handed_out) {
  pthread_mutex_lock(mu);
  while (completed != handed_out) pthread_cond_wait(cond, mu);
  pthread_mutex_unlock(mu);
}

// Verbs return errno values; those returning pointers set errno and return NULL (ibv_*(3) RETURN VALUE).
template <typename T>
T* Fail(int err) {
  errno = err;
  return nullptr;
}

struct Pd {
  ibv_pd pd;
  emu::ProtectionDomain* emu;
  // A parent domain (ibv_alloc_parent_domain(3)) stands in every verb for the protection domain it extends: `emu` is
  // that PD's, and `extends` points at it.
  Pd* extends = nullptr;
  std::atomic<int> parent_domains{0};  // parent domains extending this PD: it cannot be deallocated before them
  // Another process's PD (imported through a context of its cmd_fd): its owner number; `emu` is the PD of ours that
  // stands for it, and pd.handle is its handle there.
  uint8_t imported_owner = 0;
};
inline Pd* ToPd(ibv_pd* p) { return reinterpret_cast<Pd*>(p); }

struct Mr {
  ibv_mr mr;
  uint8_t imported_owner = 0;  // another process's region (imported through one of its PDs): its owner number
};

struct CompChannel {
  ibv_comp_channel channel;
  EventQueue<ibv_cq*> events;
};
inline CompChannel* ToChannel(ibv_comp_channel* c) { return reinterpret_cast<CompChannel*>(c); }

struct Cq {
  ibv_cq_ex cqx;  // ibv_cq's fields are its first members (ibv_cq_ex_to_cq is a cast)
  emu::CompletionQueue* emu;
  uint64_t wc_flags;          // IBV_WC_EX_WITH_* requested at create_cq_ex
  emu::Completion current{};  // the entry start_poll/next_poll made current
  // Events handed to the application (under the lock of the queue that held them), which ibv_destroy_cq waits to see
  // acknowledged (ibv_ack_cq_events, ibv_ack_async_event), as ibv_get_cq_event(3) and ibv_get_async_event(3) say.
  uint32_t comp_events_reported;
  uint32_t async_events_reported;
};
inline Cq* ToCq(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }
inline Cq* ToCq(ibv_cq_ex* c) { return reinterpret_cast<Cq*>(c); }

struct Qp {
  ibv_qp_ex qpx;  // qp_base first
  emu::QueuePair* emu;
  void* send_ops = nullptr;  // ibv_wr_* batch state (qp_ex_ops.cc); non-null iff created with send ops
  uint32_t events_reported = 0;  // async events handed to the application (as Cq's)
};
inline Qp* ToQp(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }

struct Ah {
  ibv_ah ah;
  emu::AddressHandle* emu;
};
inline Ah* ToAh(ibv_ah* a) { return reinterpret_cast<Ah*>(a); }

// Shared receive queues and XRC domains (srq_verbs.cc).
struct Srq {
  ibv_srq srq;
  emu::SharedReceiveQueue* emu;
  uint32_t events_reported = 0;  // async events handed to the application (as Cq's)
};
inline Srq* ToSrq(ibv_srq* s) { return reinterpret_cast<Srq*>(s); }

struct Xrcd {
  ibv_xrcd xrcd;
  emu::XrcDomain* emu;
};
inline Xrcd* ToXrcd(ibv_xrcd* x) { return reinterpret_cast<Xrcd*>(x); }

// XRC targets may have several ibv_qp handles (ibv_open_qp): each is tracked so that async events of the QP keep a
// live owner when the handle that created it is destroyed first. Call Track for every handle on an XRC_RECV QP and
// Untrack before destroying one.
void TrackXrcTarget(Qp* qp);
void UntrackXrcTarget(Qp* qp);

// Posts an asynchronous event to the context's async fd (called from the device with its lock held).
void DeliverAsyncEvent(Context* ctx, const emu::AsyncEvent& e);

// Conversions between the verbs structs and emu's.
// A window bind (ibv_bind_mw, IBV_WR_BIND_MW, ibv_wr_bind_mw): window `mw` gets `new_rkey` and what `info` opens.
emu::SendWr::Bind ToEmuBind(const ibv_mw& mw, uint32_t new_rkey, const ibv_mw_bind_info& info);
emu::AddressVector ToAddressVector(const ibv_ah_attr& a);
ibv_ah_attr FromAddressVector(const emu::AddressVector& av);

}  // namespace uroce::verbs
