// Shared receive queues and XRC domains (IBTA vol1 chapters 10-11: shared receive queues and their verbs; Annex A14, the
// Extended Reliable Connected transport: XRC domains, XRC SRQs).
//
// A SharedReceiveQueue is a pool of receive WQEs that several QPs draw from: RC and UD QPs attached at create time,
// or XRC target QPs that name it per message in the XRCETH. It owns the WQEs and the limit ("low watermark") state;
// the Device owns the SRQ objects, decides which QP takes from which SRQ, and raises the async events.
//
// An XrcDomain groups XRC SRQs and XRC target QPs: a target QP may deliver only into SRQs of its own domain.
//
// A SharedReceiveQueue locks itself (several QPs take from it while their own locks are held); an XrcDomain is only
// touched under the Device's object lock.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <span>

#include "emu/completion_queue.h"
#include "emu/memory.h"
#include "emu/work_request.h"

namespace uroce::emu {

// Attribute mask bits of modify_srq (values of enum ibv_srq_attr_mask).
namespace srq_attr {
inline constexpr uint32_t kMaxWr = 1u << 0;
inline constexpr uint32_t kLimit = 1u << 1;
}  // namespace srq_attr

// The emu image of struct ibv_srq_attr.
struct SrqAttributes {
  uint32_t max_wr = 0;
  uint32_t max_sge = 0;
  uint32_t srq_limit = 0;
};

class XrcDomain {
 public:
  XrcDomain(uint32_t handle, std::optional<uint64_t> inode) : handle_(handle), inode_(inode) {}
  uint32_t handle() const { return handle_; }
  // The file (inode) the domain is associated with; nullopt for a private domain (ibv_open_xrcd(3): fd -1).
  const std::optional<uint64_t>& inode() const { return inode_; }
  // Opens not yet closed (ibv_open_xrcd(3): "If this is the last reference, the XRCD will be destroyed").
  int references = 1;

 private:
  uint32_t handle_;
  std::optional<uint64_t> inode_;
};

enum class SrqType : uint8_t { kBasic = 0, kXrc = 1 };  // enum ibv_srq_type (tag matching is not offered)

class SharedReceiveQueue {
 public:
  // `attr.max_wr` and `attr.max_sge` as granted (already checked against the device limits).
  SharedReceiveQueue(uint32_t srqn, SrqType type, ProtectionDomain* pd, const SrqAttributes& attr,
                     XrcDomain* xrcd, CompletionQueue* cq)
      : srqn_(srqn), type_(type), pd_(pd), max_wr_(attr.max_wr), max_sge_(attr.max_sge), xrcd_(xrcd), cq_(cq) {}

  uint32_t srqn() const { return srqn_; }
  SrqType type() const { return type_; }
  ProtectionDomain* pd() const { return pd_; }
  XrcDomain* xrcd() const { return xrcd_; }
  // XRC only: where completions of WQEs taken from this SRQ go (Annex A14: the SRQ, not the target QP, has the CQ).
  CompletionQueue* cq() const { return cq_; }
  uint32_t max_sge() const { return max_sge_; }  // fixed at creation: read without the lock
  size_t depth() const {
    std::lock_guard lock(mu_);
    return queued_;
  }

  // Queues a receive WQE: EINVAL when it has more SGEs than max_sge, ENOMEM when max_wr WQEs are queued.
  int Post(RecvWr&& wr);
  bool empty() const {
    std::lock_guard lock(mu_);
    return queued_ == 0;
  }
  // Takes the oldest WQE (nullopt when empty). Sets *limit_reached when this take brought the number of WQEs below an
  // armed limit: the limit event fires once per arming, so the SRQ disarms itself (srq_limit reads 0 afterwards;
  // ibv_query_srq(3) NOTES).
  std::optional<RecvWr> Take(bool* limit_reached);
  // A shared SRQ's: takes WQE number `index` (counted in posting order from the SRQ's creation), which a claim
  // reserved (nullopt when it is not queued); as Take otherwise.
  std::optional<RecvWr> TakeAt(uint64_t index, bool* limit_reached);
  // A shared SRQ's window (wire::SharedXrc): hands `show` the WQEs posted and not yet shown, up to number
  // `claimed + window`, with their lengths, and counts them shown. Under the SRQ's lock: shows never interleave.
  void ShowWindow(uint64_t claimed, uint32_t window,
                  const std::function<void(uint64_t first, std::span<const uint32_t> lengths)>& show);
  // Every queued WQE, oldest first, removed (destroy).
  std::deque<RecvWr> TakeAll();

  // ibv_modify_srq(3): kMaxWr resizes (EINVAL below the WQEs already queued, or 0, or above `max_wr_limit`), kLimit
  // arms the limit event (EINVAL when the limit exceeds max_wr). Nothing changes unless every attribute is valid.
  // Other bits: EINVAL.
  int Modify(const SrqAttributes& attr, uint32_t mask, uint32_t max_wr_limit);
  SrqAttributes Query() const {
    std::lock_guard lock(mu_);
    return {max_wr_, max_sge_, limit_};
  }

  // QPs attached to (RC/UD) or created for this SRQ; destroy is refused while non-zero (ibv_destroy_srq(3) NOTES).
  // Changed and read under the Device's object lock held exclusively.
  int users = 0;
  // Opaque back-pointer for the layer above (verbs_api's ibv_srq), so an async event finds its owner.
  void* owner = nullptr;
  // XRC: published to the host's other processes (DeviceConfig::shared_xrc), whose target QPs of its domain deliver
  // into it; then every take is claimed there first. Set at creation.
  bool shared = false;

 private:
  const uint32_t srqn_;
  const SrqType type_;
  ProtectionDomain* pd_;
  uint32_t max_wr_;
  uint32_t max_sge_;
  uint32_t limit_ = 0;  // 0: not armed
  XrcDomain* xrcd_;
  CompletionQueue* cq_;
  // Drops taken WQEs from the front (with the lock).
  void TrimLocked();
  std::optional<RecvWr> TakeAtLocked(uint64_t index, bool* limit_reached);

  mutable std::mutex mu_;  // guards max_wr_, limit_ and the queue
  // WQEs in posting order; a shared SRQ's may be taken out of order (TakeAt), leaving an empty place until the older
  // ones are taken. wqes_.front() is WQE number front_index_.
  std::deque<std::optional<RecvWr>> wqes_;
  uint64_t front_index_ = 0;
  size_t queued_ = 0;  // WQEs in wqes_
  uint64_t shown_ = 0;  // ShowWindow: WQEs [0, shown_) were shown
};

}  // namespace uroce::emu
