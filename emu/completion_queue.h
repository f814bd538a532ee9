// A completion queue: a bounded ring of completions, polled by the application, with the notification ("arm")
// semantics of ibv_req_notify_cq (IBTA 11.4.2.2): once armed, the next completion — or, armed solicited-only, the next
// solicited or error completion — fires the notifier exactly once.
//
// The CQ has its own lock (the application's poll loop must not contend with packet processing). Lock order: a
// QP's lock (device_core.h), then a CQ's lock; the notifier runs without the CQ's (a QP's may be held).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "emu/work_request.h"

namespace uroce::emu {

// Completion events held back while the packets of the same processing step wait to be sent. Device::OnDatagram
// opens one around a packet: the ACK it builds leaves before the event that wakes the application, whose answer could
// otherwise reach the wire ahead of the ACK of the request it answers -- a real HCA acknowledges on arrival, and
// programs see that order (perftest's latency tests with -e take the first event on their one channel as their send's
// completion). The CQ is disarmed when its event is raised, as when it is delivered at once; only the delivery waits.
class HeldNotifications {
 public:
  HeldNotifications() : outer_(current_) { current_ = this; }
  ~HeldNotifications() { current_ = outer_; }
  HeldNotifications(const HeldNotifications&) = delete;
  HeldNotifications& operator=(const HeldNotifications&) = delete;
  // The scope open on this thread, or nullptr (events are then delivered at once).
  static HeldNotifications* current() { return current_; }
  void Add(uint32_t cq_handle) { handles_.push_back(cq_handle); }
  // The CQs whose events wait, in the order they were raised; the owner delivers them (CompletionQueue::Notify)
  // after sending, for the CQs that still exist.
  const std::vector<uint32_t>& handles() const { return handles_; }

 private:
  static thread_local HeldNotifications* current_;
  HeldNotifications* outer_;
  std::vector<uint32_t> handles_;
};

class CompletionQueue {
 public:
  // Called when an armed CQ gets a qualifying completion (verbs_api posts it to the completion channel).
  using Notifier = std::function<void(CompletionQueue&)>;

  CompletionQueue(uint32_t handle, uint32_t capacity) : handle_(handle), ring_(capacity + 1) {}

  uint32_t handle() const { return handle_; }
  // Opaque back-pointer for the layer above (verbs_api's ibv_cq).
  void* owner = nullptr;
  // Whether completions carry the device clock (Completion::timestamp_ns): only a CQ created to report it
  // (ibv_create_cq_ex(3), IBV_WC_EX_WITH_COMPLETION_TIMESTAMP[_WALLCLOCK]) may read it, and reading the clock for
  // every completion cost a ping-pong ~25 ns per completion. Set before the CQ is used.
  bool timestamps = false;
  uint32_t capacity() const;

  // Adds a completion. Returns false, and drops it, when the ring is full: the caller raises IBV_EVENT_CQ_ERR
  // (IBTA 11.6.3: CQ overrun is an affiliated asynchronous error).
  bool Push(const Completion& c);
  // Takes up to `max` completions in order. Returns how many.
  int Poll(Completion* out, int max);
  // Drops every completion of QP `qpn`, keeping the others in order; returns how many were dropped. A QP moved to
  // RESET takes its completions with it, as mlx4/mlx5 do (their modify_qp to RESET cleans the CQs), so completions
  // flushed before the reset never surface as the first ones of the QP's next life.
  // The dropped completions are appended to *removed when it is given.
  size_t RemoveQp(uint32_t qpn, std::vector<Completion>* removed = nullptr);
  // Whether the CQ holds no completion, read without the lock: an application polling an empty CQ (its hot loop)
  // then neither locks nor copies. A completion pushed by another thread concurrently may be seen on the next look.
  bool Empty() const { return count_.load(std::memory_order_acquire) == 0; }
  // Looks at the oldest completion without taking it.
  bool Peek(Completion* out) const;
  uint32_t depth() const;

  // Arms the CQ; 0 or EINVAL.
  int RequestNotify(bool solicited_only);
  // Delivers an event that was held (HeldNotifications) to the notifier.
  void Notify();
  // New capacity >= current depth, else EINVAL (resize_cq, IBTA 11.2.9.3).
  int Resize(uint32_t capacity);
  void set_notifier(Notifier n);
  bool overflowed() const;

 private:
  enum class Arm : uint8_t { kNone, kNext, kSolicited };
  const uint32_t handle_;
  mutable std::mutex mu_;
  std::vector<Completion> ring_;  // one slot kept empty
  size_t head_ = 0;  // next to poll
  size_t tail_ = 0;  // next to fill
  std::atomic<uint32_t> count_{0};  // completions held (written under mu_, read by Empty without it)
  Arm arm_ = Arm::kNone;
  bool overflowed_ = false;
  Notifier notifier_;
};

}  // namespace uroce::emu
