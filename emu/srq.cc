#include "emu/srq.h"

#include <algorithm>
#include <cerrno>
#include <vector>

namespace uroce::emu {

int SharedReceiveQueue::Post(RecvWr&& wr) {
  std::lock_guard lock(mu_);
  if (wr.sg_list.size() > max_sge_) return EINVAL;
  if (queued_ >= max_wr_) return ENOMEM;
  wqes_.push_back(std::move(wr));
  ++queued_;
  return 0;
}

void SharedReceiveQueue::TrimLocked() {
  while (!wqes_.empty() && !wqes_.front()) {
    wqes_.pop_front();
    ++front_index_;
  }
}

std::optional<RecvWr> SharedReceiveQueue::TakeAt(uint64_t index, bool* limit_reached) {
  std::lock_guard lock(mu_);
  return TakeAtLocked(index, limit_reached);
}

std::optional<RecvWr> SharedReceiveQueue::TakeAtLocked(uint64_t index, bool* limit_reached) {
  *limit_reached = false;
  if (index < front_index_ || index - front_index_ >= wqes_.size() || !wqes_[index - front_index_]) return std::nullopt;
  std::optional<RecvWr> wr = std::move(wqes_[index - front_index_]);
  wqes_[index - front_index_].reset();
  --queued_;
  TrimLocked();
  // ibv_modify_srq(3) NOTES: an armed limit produces IBV_EVENT_SRQ_LIMIT_REACHED once the number of WQEs drops below
  // it; ibv_query_srq(3): afterwards srq_limit reads 0 until the consumer arms it again.
  if (limit_ != 0 && queued_ < limit_) {
    limit_ = 0;
    *limit_reached = true;
  }
  return wr;
}

std::optional<RecvWr> SharedReceiveQueue::Take(bool* limit_reached) {
  std::lock_guard lock(mu_);
  return TakeAtLocked(front_index_, limit_reached);  // trimmed: the oldest queued WQE, if any
}

std::deque<RecvWr> SharedReceiveQueue::TakeAll() {
  std::lock_guard lock(mu_);
  std::deque<RecvWr> all;
  for (std::optional<RecvWr>& wr : wqes_)
    if (wr) all.push_back(std::move(*wr));
  front_index_ += wqes_.size();
  wqes_.clear();
  queued_ = 0;
  return all;
}

void SharedReceiveQueue::ShowWindow(uint64_t claimed, uint32_t window,
                                    const std::function<void(uint64_t first, std::span<const uint32_t>)>& show) {
  std::lock_guard lock(mu_);
  const uint64_t posted = front_index_ + wqes_.size();
  const uint64_t until = std::min(posted, claimed + window);
  if (until <= shown_) return;
  std::vector<uint32_t> lengths;
  for (uint64_t i = shown_; i < until; ++i) {
    // Not claimed yet (only shown ones are): still queued, unless a flush took it (Device::Fail).
    const bool queued = i >= front_index_ && wqes_[i - front_index_].has_value();
    const uint64_t total = queued ? wqes_[i - front_index_]->TotalLength() : 0;
    lengths.push_back(uint32_t(std::min<uint64_t>(total, UINT32_MAX)));
  }
  show(shown_, lengths);
  shown_ = until;
}

int SharedReceiveQueue::Modify(const SrqAttributes& attr, uint32_t mask, uint32_t max_wr_limit) {
  std::lock_guard lock(mu_);
  if (mask & ~(srq_attr::kMaxWr | srq_attr::kLimit)) return EINVAL;
  uint32_t max_wr = max_wr_;
  if (mask & srq_attr::kMaxWr) {
    // A resize may not drop WQEs already queued, and the queue must keep room for at least one.
    if (attr.max_wr == 0 || attr.max_wr > max_wr_limit || attr.max_wr < queued_) return EINVAL;
    max_wr = attr.max_wr;
  }
  if ((mask & srq_attr::kLimit) && attr.srq_limit > max_wr) return EINVAL;
  max_wr_ = max_wr;
  if (mask & srq_attr::kLimit) limit_ = attr.srq_limit;
  return 0;
}

}  // namespace uroce::emu
