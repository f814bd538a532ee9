#include "emu/srq.h"

#include <cerrno>

namespace uroce::emu {

int SharedReceiveQueue::Post(RecvWr&& wr, uint64_t* posted) {
  std::lock_guard lock(mu_);
  if (wr.sg_list.size() > max_sge_) return EINVAL;
  if (wqes_.size() >= max_wr_) return ENOMEM;
  wqes_.push_back(std::move(wr));
  ++posted_;
  if (posted != nullptr) *posted = posted_;
  return 0;
}

std::optional<RecvWr> SharedReceiveQueue::Take(bool* limit_reached) {
  std::lock_guard lock(mu_);
  *limit_reached = false;
  if (wqes_.empty()) return std::nullopt;
  RecvWr wr = std::move(wqes_.front());
  wqes_.pop_front();
  // ibv_modify_srq(3) NOTES: an armed limit produces IBV_EVENT_SRQ_LIMIT_REACHED once the number of WQEs drops below
  // it; ibv_query_srq(3): afterwards srq_limit reads 0 until the consumer arms it again.
  if (limit_ != 0 && wqes_.size() < limit_) {
    limit_ = 0;
    *limit_reached = true;
  }
  return wr;
}

std::deque<RecvWr> SharedReceiveQueue::TakeAll() {
  std::lock_guard lock(mu_);
  std::deque<RecvWr> all;
  all.swap(wqes_);
  return all;
}

int SharedReceiveQueue::Modify(const SrqAttributes& attr, uint32_t mask, uint32_t max_wr_limit) {
  std::lock_guard lock(mu_);
  if (mask & ~(srq_attr::kMaxWr | srq_attr::kLimit)) return EINVAL;
  uint32_t max_wr = max_wr_;
  if (mask & srq_attr::kMaxWr) {
    // A resize may not drop WQEs already queued, and the queue must keep room for at least one.
    if (attr.max_wr == 0 || attr.max_wr > max_wr_limit || attr.max_wr < wqes_.size()) return EINVAL;
    max_wr = attr.max_wr;
  }
  if ((mask & srq_attr::kLimit) && attr.srq_limit > max_wr) return EINVAL;
  max_wr_ = max_wr;
  if (mask & srq_attr::kLimit) limit_ = attr.srq_limit;
  return 0;
}

}  // namespace uroce::emu
