#include "emu/completion_queue.h"

#include <cerrno>

namespace uroce::emu {

thread_local HeldNotifications* HeldNotifications::current_ = nullptr;

uint32_t CompletionQueue::capacity() const {
  std::lock_guard lock(mu_);
  return static_cast<uint32_t>(ring_.size() - 1);
}

uint32_t CompletionQueue::depth() const {
  std::lock_guard lock(mu_);
  return static_cast<uint32_t>((tail_ + ring_.size() - head_) % ring_.size());
}

bool CompletionQueue::Push(const Completion& c) {
  Notifier fire;
  {
    std::lock_guard lock(mu_);
    const size_t next = (tail_ + 1) % ring_.size();
    if (next == head_) {
      overflowed_ = true;
      return false;
    }
    ring_[tail_] = c;
    tail_ = next;
    count_.fetch_add(1, std::memory_order_release);
    const bool qualifies =
        arm_ == Arm::kNext || (arm_ == Arm::kSolicited && (c.solicited || c.status != WcStatus::kSuccess));
    if (qualifies && notifier_) {
      arm_ = Arm::kNone;
      fire = notifier_;
    }
  }
  if (fire) {
    if (HeldNotifications* held = HeldNotifications::current())
      held->Add(handle_);
    else
      fire(*this);
  }
  return true;
}

void CompletionQueue::Notify() {
  Notifier fire;
  {
    std::lock_guard lock(mu_);
    fire = notifier_;
  }
  if (fire) fire(*this);
}

int CompletionQueue::Poll(Completion* out, int max) {
  std::lock_guard lock(mu_);
  int n = 0;
  while (n < max && head_ != tail_) {
    out[n++] = ring_[head_];
    head_ = (head_ + 1) % ring_.size();
  }
  count_.fetch_sub(uint32_t(n), std::memory_order_relaxed);
  return n;
}

size_t CompletionQueue::RemoveQp(uint32_t qpn, std::vector<Completion>* removed) {
  std::lock_guard lock(mu_);
  size_t kept = head_;
  for (size_t i = head_; i != tail_; i = (i + 1) % ring_.size()) {
    if (ring_[i].qp_num == qpn) {
      if (removed != nullptr) removed->push_back(ring_[i]);
      continue;
    }
    if (kept != i) ring_[kept] = ring_[i];
    kept = (kept + 1) % ring_.size();
  }
  const size_t dropped = (tail_ + ring_.size() - kept) % ring_.size();
  tail_ = kept;
  count_.fetch_sub(uint32_t(dropped), std::memory_order_relaxed);
  return dropped;
}

bool CompletionQueue::Peek(Completion* out) const {
  std::lock_guard lock(mu_);
  if (head_ == tail_) return false;
  *out = ring_[head_];
  return true;
}

int CompletionQueue::RequestNotify(bool solicited_only) {
  std::lock_guard lock(mu_);
  // Arming for "next" overrides an earlier solicited-only arm, never the reverse (IBTA 11.4.2.2).
  if (solicited_only) {
    if (arm_ == Arm::kNone) arm_ = Arm::kSolicited;
  } else {
    arm_ = Arm::kNext;
  }
  return 0;
}

int CompletionQueue::Resize(uint32_t capacity) {
  std::lock_guard lock(mu_);
  const size_t used = (tail_ + ring_.size() - head_) % ring_.size();
  if (capacity < used || capacity == 0) return EINVAL;
  std::vector<Completion> ring(capacity + 1);
  for (size_t i = 0; i < used; ++i) ring[i] = ring_[(head_ + i) % ring_.size()];
  ring_ = std::move(ring);
  head_ = 0;
  tail_ = used;
  return 0;
}

void CompletionQueue::set_notifier(Notifier n) {
  std::lock_guard lock(mu_);
  notifier_ = std::move(n);
}

bool CompletionQueue::overflowed() const {
  std::lock_guard lock(mu_);
  return overflowed_;
}

}  // namespace uroce::emu
