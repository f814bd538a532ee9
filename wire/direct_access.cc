#include "wire/direct_access.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "wire/sealed_memfd.h"

namespace uroce::wire {

struct DirectTable::Layout {
  struct Header {
    uint64_t magic;
    int32_t pid;
    uint32_t qp_slots;
    uint32_t region_slots;
  };
  struct alignas(64) Initiator {
    std::atomic<uint64_t> entered;
    std::atomic<uint64_t> left;
    std::atomic<int32_t> pid;
    // Its offer (OfferCopy): the fields are written in kFilling, read by the owner once it took them (kTaken).
    std::atomic<uint32_t> offer;  // Offer
    std::atomic<uint32_t> offer_rkey;
    std::atomic<uint64_t> offer_src, offer_there, offer_length;
  };
  struct QpSlot {
    std::atomic<uint32_t> key;  // kQpValid | qpn, 0: empty
    uint32_t peer_qpn, pd, rights;
  };
  struct RegionSlot {
    std::atomic<uint64_t> key;  // kRegionValid | rkey, 0: empty
    uint32_t pd, rights;
    uint64_t iova, length, host;
  };
  struct alignas(64) ReceiveSlot {
    // The owner's lines.
    std::atomic<uint32_t> key;  // kQpValid | qpn, 0: empty
    std::atomic<uint32_t> epoch;
    std::atomic<uint64_t> posted;
    std::atomic<uint64_t> packets_taken;
    std::atomic<uint32_t> lengths[kReceiveWindow];
    // The initiator's.
    alignas(64) std::atomic<uint64_t> sends;
  };
  struct alignas(64) SrqSlot {
    // The owner's lines.
    std::atomic<uint32_t> key;  // kQpValid | srqn, 0: empty
    std::atomic<uint64_t> domain;
    std::atomic<uint64_t> posted;
    std::atomic<uint32_t> lengths[kSrqWindow];
    // The claimants'.
    alignas(64) std::atomic<uint64_t> claimed;
  };
  struct alignas(64) TargetSlot {
    std::atomic<uint32_t> key;      // kQpValid | qpn (| kClosing), 0: empty
    std::atomic<uint32_t> version;  // a sequence count: odd while the attributes are rewritten
    std::atomic<uint64_t> domain;
    std::atomic<uint32_t> attribute_bytes;
    std::atomic<uint64_t> holders[4];  // the openers'
    std::atomic<uint64_t> attributes[kTargetAttributeBytes / 8];
  };
  struct PdSlot {
    std::atomic<uint32_t> key;  // kQpValid | handle, 0: empty
    uint32_t unused;
  };
  struct ExportSlot {
    std::atomic<uint64_t> key;  // kRegionValid | lkey, 0: empty
    uint32_t pd, access;
    uint64_t iova, length, host;
  };
  static constexpr uint32_t kQpValid = 1u << 31;
  static constexpr uint32_t kClosing = 1u << 30;
  static constexpr uint64_t kRegionValid = uint64_t{1} << 32;
  static constexpr size_t kInitiatorsOffset = 64;
  static constexpr size_t kQpOffset = kInitiatorsOffset + 256 * sizeof(Initiator);
  static constexpr size_t kRegionOffset = kQpOffset + kQpSlots * sizeof(QpSlot);
  static constexpr size_t kReceiveOffset = (kRegionOffset + kRegionSlots * sizeof(RegionSlot) + 63) & ~size_t{63};
  static constexpr size_t kSrqOffset = kReceiveOffset + kReceiveSlots * sizeof(ReceiveSlot);
  static constexpr size_t kTargetOffset = kSrqOffset + kSrqSlots * sizeof(SrqSlot);
  static constexpr size_t kPdOffset = kTargetOffset + kTargetSlots * sizeof(TargetSlot);
  static constexpr size_t kExportOffset = kPdOffset + kPdSlots * sizeof(PdSlot);
  static constexpr size_t kBytes = kExportOffset + kExportSlots * sizeof(ExportSlot);
  static_assert(sizeof(Initiator) == 64 && sizeof(QpSlot) == 16 && sizeof(RegionSlot) == 40 &&
                sizeof(ReceiveSlot) == 192 && sizeof(SrqSlot) == 384 && sizeof(TargetSlot) == 320 &&
                sizeof(PdSlot) == 8 && sizeof(ExportSlot) == 40);
  static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free);

  // Process `self` holds initiator slot `i`'s owner number. When that is news, a process before it held the number
  // and is gone: what it left of an offer (one it died waiting for) is nobody's.
  static void NoteNumber(Initiator& i, pid_t self) {
    if (i.pid.load(std::memory_order_relaxed) == self) return;
    i.pid.store(self, std::memory_order_relaxed);
    i.offer.store(uint32_t(Offer::kNone), std::memory_order_seq_cst);
  }
  static Header* header(void* base) { return static_cast<Header*>(base); }
  static Initiator* initiators(void* base) {
    return reinterpret_cast<Initiator*>(static_cast<uint8_t*>(base) + kInitiatorsOffset);
  }
  static QpSlot* qps(void* base) { return reinterpret_cast<QpSlot*>(static_cast<uint8_t*>(base) + kQpOffset); }
  static RegionSlot* regions(void* base) {
    return reinterpret_cast<RegionSlot*>(static_cast<uint8_t*>(base) + kRegionOffset);
  }
  static ReceiveSlot* receives(void* base) {
    return reinterpret_cast<ReceiveSlot*>(static_cast<uint8_t*>(base) + kReceiveOffset);
  }
  static SrqSlot* srqs(void* base) { return reinterpret_cast<SrqSlot*>(static_cast<uint8_t*>(base) + kSrqOffset); }
  static TargetSlot* targets(void* base) {
    return reinterpret_cast<TargetSlot*>(static_cast<uint8_t*>(base) + kTargetOffset);
  }
  static PdSlot* pds(void* base) { return reinterpret_cast<PdSlot*>(static_cast<uint8_t*>(base) + kPdOffset); }
  static ExportSlot* exports(void* base) {
    return reinterpret_cast<ExportSlot*>(static_cast<uint8_t*>(base) + kExportOffset);
  }
};

bool ProcessGone(pid_t pid) { return pid <= 0 || (kill(pid, 0) < 0 && errno == ESRCH); }

namespace {

// Where a number's probe sequence starts: a multiplicative hash, since QPNs and keys count up from a random start.
uint32_t Home(uint32_t number, uint32_t slots) { return (number * 0x9E3779B1u) % slots; }

}  // namespace

DirectTable::DirectTable(void* base, size_t bytes) : base_(base), bytes_(bytes) {}

DirectTable::~DirectTable() { munmap(base_, bytes_); }

int DirectTable::Create(std::unique_ptr<DirectTable>* table, int* fd) {
  void* base = nullptr;
  if (int rc = CreateSealedMemfd("uroce-direct-table", Layout::kBytes, &base, fd); rc < 0) return rc;
  // A new file is zeroed: every slot empty, every counter 0.
  *Layout::header(base) = {kMagic, int32_t(getpid()), kQpSlots, kRegionSlots};
  table->reset(new DirectTable(base, Layout::kBytes));
  return 0;
}

int DirectTable::Attach(int fd, std::unique_ptr<DirectTable>* table) {
  void* base = nullptr;
  size_t bytes = 0;
  if (int rc = MapSealedMemfd(fd, &base, &bytes); rc < 0) return rc;
  const Layout::Header* h = bytes == Layout::kBytes ? Layout::header(base) : nullptr;
  if (h == nullptr || h->magic != kMagic || h->qp_slots != kQpSlots || h->region_slots != kRegionSlots ||
      h->pid <= 0) {
    munmap(base, bytes);
    return -EINVAL;
  }
  table->reset(new DirectTable(base, Layout::kBytes));
  return 0;
}

pid_t DirectTable::pid() const { return Layout::header(base_)->pid; }

void DirectTable::WaitForCopies() {
  Layout::Initiator* init = Layout::initiators(base_);
  for (int n = 1; n < 256; ++n) {
    const uint64_t entered = init[n].entered.load(std::memory_order_seq_cst);
    for (unsigned spins = 0; init[n].left.load(std::memory_order_seq_cst) < entered; ++spins) {
      // A copy takes microseconds; one that takes long belongs to a process that may have died inside it.
      if (spins < 64) {
        std::this_thread::yield();
        continue;
      }
      if (ProcessGone(init[n].pid.load(std::memory_order_relaxed))) break;
      usleep(50);
    }
  }
}

namespace {

// The slot of `number`'s probe sequence (kProbe slots from its home) whose key is `key`: a key 0 finds a free one.
template <typename Slot, typename Key>
Slot* Probe(Slot* slots, uint32_t count, uint32_t number, Key key) {
  const uint32_t home = Home(number, count);
  for (uint32_t i = 0; i < DirectTable::kProbe; ++i) {
    Slot& s = slots[(home + i) % count];
    if (s.key.load(std::memory_order_seq_cst) == key) return &s;
  }
  return nullptr;
}

}  // namespace

template <typename Slot>
bool DirectTable::Unpublish(std::unordered_map<uint32_t, uint32_t>& index, Slot* slots, uint32_t number) {
  auto it = index.find(number);
  if (it == index.end()) return false;
  slots[it->second].key.store(0, std::memory_order_seq_cst);
  index.erase(it);
  return true;
}

template <typename Slot>
void DirectTable::Withdraw(std::unordered_map<uint32_t, uint32_t>& index, Slot* slots, uint32_t number) {
  if (Unpublish(index, slots, number)) WaitForCopies();
}

bool DirectTable::PublishQp(const DirectAccess::QpEntry& qp) {
  std::lock_guard lock(mu_);
  Layout::QpSlot* slots = Layout::qps(base_);
  if (auto it = qp_slot_.find(qp.qpn); it != qp_slot_.end()) {
    const Layout::QpSlot& s = slots[it->second];
    if (s.peer_qpn == qp.peer_qpn && s.pd == qp.pd && s.rights == qp.rights) return true;  // as published
  }
  Withdraw(qp_slot_, slots, qp.qpn);
  Layout::QpSlot* s = Probe(slots, kQpSlots, qp.qpn, 0u);
  if (s == nullptr) return false;
  s->peer_qpn = qp.peer_qpn;
  s->pd = qp.pd;
  s->rights = qp.rights;
  s->key.store(Layout::kQpValid | qp.qpn, std::memory_order_seq_cst);  // the fields before the key
  qp_slot_[qp.qpn] = uint32_t(s - slots);
  return true;
}

void DirectTable::WithdrawQp(uint32_t qpn) {
  std::lock_guard lock(mu_);
  Withdraw(qp_slot_, Layout::qps(base_), qpn);
}

bool DirectTable::PublishRegion(const DirectAccess::Region& region) {
  std::lock_guard lock(mu_);
  Layout::RegionSlot* slots = Layout::regions(base_);
  Withdraw(region_slot_, slots, region.rkey);
  Layout::RegionSlot* s = Probe(slots, kRegionSlots, region.rkey, uint64_t{0});
  if (s == nullptr) return false;
  s->pd = region.pd;
  s->rights = region.rights;
  s->iova = region.iova;
  s->length = region.length;
  s->host = reinterpret_cast<uint64_t>(region.host);
  s->key.store(Layout::kRegionValid | region.rkey, std::memory_order_seq_cst);
  region_slot_[region.rkey] = uint32_t(s - slots);
  return true;
}

void DirectTable::WithdrawRegion(uint32_t rkey) {
  std::lock_guard lock(mu_);
  Withdraw(region_slot_, Layout::regions(base_), rkey);
}

bool DirectTable::ExportPd(uint32_t handle) {
  std::lock_guard lock(mu_);
  if (pd_slot_.count(handle)) return true;
  Layout::PdSlot* slots = Layout::pds(base_);
  Layout::PdSlot* s = Probe(slots, kPdSlots, handle, 0u);
  if (s == nullptr) return false;
  s->key.store(Layout::kQpValid | handle, std::memory_order_seq_cst);
  pd_slot_[handle] = uint32_t(s - slots);
  return true;
}

void DirectTable::WithdrawPd(uint32_t handle) {
  std::lock_guard lock(mu_);
  Unpublish(pd_slot_, Layout::pds(base_), handle);  // no copy reads a PD: nothing to wait for
}

bool DirectTable::ExportRegion(const ExportedRegion& region) {
  std::lock_guard lock(mu_);
  Layout::ExportSlot* slots = Layout::exports(base_);
  Withdraw(export_slot_, slots, region.lkey);
  // Homed by the handle (the key's index), which is all an importer knows.
  Layout::ExportSlot* s = Probe(slots, kExportSlots, region.lkey >> 8, uint64_t{0});
  if (s == nullptr) return false;
  s->pd = region.pd;
  s->access = region.access;
  s->iova = region.iova;
  s->length = region.length;
  s->host = region.host;
  s->key.store(Layout::kRegionValid | region.lkey, std::memory_order_seq_cst);  // the fields before the key
  export_slot_[region.lkey] = uint32_t(s - slots);
  return true;
}

void DirectTable::WithdrawExportedRegion(uint32_t lkey) {
  std::lock_guard lock(mu_);
  Withdraw(export_slot_, Layout::exports(base_), lkey);
}

bool DirectTable::HasPd(uint32_t handle) const {
  return handle != 0 && Probe(Layout::pds(base_), kPdSlots, handle, Layout::kQpValid | handle) != nullptr;
}

const void* DirectTable::FindExport(uint32_t handle, ExportedRegion* out) const {
  const uint32_t home = Home(handle, kExportSlots);
  const Layout::ExportSlot* slots = Layout::exports(base_);
  for (uint32_t i = 0; i < kProbe; ++i) {
    const Layout::ExportSlot& s = slots[(home + i) % kExportSlots];
    const uint64_t key = s.key.load(std::memory_order_seq_cst);
    if (!(key & Layout::kRegionValid) || (uint32_t(key) >> 8) != handle) continue;
    if (out != nullptr) *out = {uint32_t(key), s.pd, s.access, s.iova, s.length, s.host};
    return &s;
  }
  return nullptr;
}

bool DirectTable::FindExportedRegion(uint32_t handle, ExportedRegion* out) const {
  return handle != 0 && FindExport(handle, out) != nullptr;
}

bool DirectTable::Exported(uint32_t lkey, uint64_t there, uint64_t n) const {
  ExportedRegion r;
  if (FindExport(lkey >> 8, &r) == nullptr || r.lkey != lkey) return false;
  return there >= r.host && n <= r.length && there - r.host <= r.length - n;
}

bool DirectTable::OpenReceives(uint32_t qpn, uint32_t epoch) {
  std::lock_guard lock(mu_);
  Layout::ReceiveSlot* slots = Layout::receives(base_);
  Withdraw(receive_slot_, slots, qpn);
  Layout::ReceiveSlot* s = Probe(slots, kReceiveSlots, qpn, 0u);
  if (s == nullptr) return false;
  s->epoch.store(epoch, std::memory_order_relaxed);
  s->posted.store(0, std::memory_order_relaxed);
  s->packets_taken.store(0, std::memory_order_relaxed);
  s->sends.store(0, std::memory_order_relaxed);
  s->key.store(Layout::kQpValid | qpn, std::memory_order_seq_cst);  // the fields before the key
  receive_slot_[qpn] = uint32_t(s - slots);
  return true;
}

void DirectTable::PublishReceives(uint32_t qpn, uint64_t packets_taken, uint64_t first,
                                  std::span<const uint32_t> lengths) {
  std::lock_guard lock(mu_);
  auto it = receive_slot_.find(qpn);
  if (it == receive_slot_.end()) return;
  Layout::ReceiveSlot& s = Layout::receives(base_)[it->second];
  for (size_t i = 0; i < lengths.size(); ++i)
    s.lengths[(first + i) % kReceiveWindow].store(lengths[i], std::memory_order_relaxed);
  s.packets_taken.store(packets_taken, std::memory_order_release);
  s.posted.store(first + lengths.size(), std::memory_order_release);  // after the lengths it shows
}

uint64_t DirectTable::DirectSends(uint32_t qpn) {
  std::lock_guard lock(mu_);
  auto it = receive_slot_.find(qpn);
  return it == receive_slot_.end() ? 0 : Layout::receives(base_)[it->second].sends.load(std::memory_order_seq_cst);
}

void DirectTable::CloseReceives(uint32_t qpn) {
  std::lock_guard lock(mu_);
  Withdraw(receive_slot_, Layout::receives(base_), qpn);
}

bool DirectTable::PublishSrq(uint32_t srqn, uint64_t domain) {
  std::lock_guard lock(mu_);
  Layout::SrqSlot* slots = Layout::srqs(base_);
  Withdraw(srq_slot_, slots, srqn);
  Layout::SrqSlot* s = Probe(slots, kSrqSlots, srqn, 0u);
  if (s == nullptr) return false;
  s->domain.store(domain, std::memory_order_relaxed);
  s->posted.store(0, std::memory_order_relaxed);
  s->claimed.store(0, std::memory_order_relaxed);
  s->key.store(Layout::kQpValid | srqn, std::memory_order_seq_cst);  // the fields before the key
  srq_slot_[srqn] = uint32_t(s - slots);
  return true;
}

uint64_t DirectTable::SrqClaimed(uint32_t srqn) {
  std::lock_guard lock(mu_);
  auto it = srq_slot_.find(srqn);
  return it == srq_slot_.end() ? 0 : Layout::srqs(base_)[it->second].claimed.load(std::memory_order_acquire);
}

void DirectTable::ShowSrqWqes(uint32_t srqn, uint64_t first, std::span<const uint32_t> lengths) {
  std::lock_guard lock(mu_);
  auto it = srq_slot_.find(srqn);
  if (it == srq_slot_.end()) return;
  Layout::SrqSlot& s = Layout::srqs(base_)[it->second];
  for (size_t i = 0; i < lengths.size(); ++i)
    s.lengths[(first + i) % kSrqWindow].store(lengths[i], std::memory_order_relaxed);
  s.posted.store(first + lengths.size(), std::memory_order_release);  // after the lengths it shows
}

void DirectTable::WithdrawSrq(uint32_t srqn) {
  std::lock_guard lock(mu_);
  Withdraw(srq_slot_, Layout::srqs(base_), srqn);
}

bool DirectTable::SrqInDomain(uint32_t srqn, uint64_t domain) const {
  const Layout::SrqSlot* s = Probe(Layout::srqs(base_), kSrqSlots, srqn, Layout::kQpValid | srqn);
  return s != nullptr && s->domain.load(std::memory_order_relaxed) == domain;
}

bool DirectTable::ClaimSrqWqe(uint32_t srqn, uint64_t* index, uint32_t* length) {
  Layout::SrqSlot* s = Probe(Layout::srqs(base_), kSrqSlots, srqn, Layout::kQpValid | srqn);
  if (s == nullptr) return false;
  uint64_t claimed = s->claimed.load(std::memory_order_acquire);
  uint32_t len = 0;
  do {
    if (claimed >= s->posted.load(std::memory_order_acquire)) return false;
    // Stable until our claim succeeds: the owner rewrites it only to show WQE claimed + kSrqWindow, which it does
    // only once WQE `claimed` is claimed.
    len = s->lengths[claimed % kSrqWindow].load(std::memory_order_relaxed);
  } while (!s->claimed.compare_exchange_weak(claimed, claimed + 1, std::memory_order_acq_rel));
  *index = claimed;
  *length = len;
  return true;
}

bool DirectTable::PublishTarget(uint32_t qpn, uint64_t domain, std::span<const uint8_t> attributes,
                                const uint64_t* holders) {
  if (attributes.size() > kTargetAttributeBytes) return false;
  std::lock_guard lock(mu_);
  Layout::TargetSlot* slots = Layout::targets(base_);
  Layout::TargetSlot* s = nullptr;
  const bool published = target_slot_.count(qpn) != 0;
  if (published) {
    s = &slots[target_slot_[qpn]];
  } else if ((s = Probe(slots, kTargetSlots, qpn, 0u)) == nullptr) {
    return false;
  }
  // A sequence count (the readers copy, then look whether it moved): odd while we write.
  const uint32_t version = s->version.load(std::memory_order_relaxed);
  s->version.store(version + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  uint64_t words[kTargetAttributeBytes / 8] = {};
  if (!attributes.empty()) std::memcpy(words, attributes.data(), attributes.size());
  for (size_t i = 0; i < std::size(words); ++i) s->attributes[i].store(words[i], std::memory_order_relaxed);
  s->attribute_bytes.store(uint32_t(attributes.size()), std::memory_order_relaxed);
  s->version.store(version + 2, std::memory_order_release);
  if (published) return true;
  s->domain.store(domain, std::memory_order_relaxed);
  for (int i = 0; i < 4; ++i) s->holders[i].store(holders != nullptr ? holders[i] : 0, std::memory_order_relaxed);
  s->key.store(Layout::kQpValid | qpn, std::memory_order_seq_cst);  // the fields before the key
  target_slot_[qpn] = uint32_t(s - slots);
  return true;
}

bool DirectTable::ReleaseTarget(uint32_t qpn) {
  std::lock_guard lock(mu_);
  auto it = target_slot_.find(qpn);
  if (it == target_slot_.end()) return true;
  Layout::TargetSlot& s = Layout::targets(base_)[it->second];
  // Closing first, the holders after (an opener sets its bit first, the key after): one of us sees the other.
  s.key.store(Layout::kQpValid | Layout::kClosing | qpn, std::memory_order_seq_cst);
  const Layout::Initiator* processes = Layout::initiators(base_);
  bool held = false;
  for (int n = 1; n < 256; ++n) {
    const uint64_t bit = uint64_t{1} << (n % 64);
    if ((s.holders[n / 64].load(std::memory_order_seq_cst) & bit) == 0) continue;
    if (!ProcessGone(processes[n].pid.load(std::memory_order_relaxed))) {
      held = true;
      break;
    }
    s.holders[n / 64].fetch_and(~bit, std::memory_order_seq_cst);  // its process is gone: its handle with it
  }
  if (held) {
    s.key.store(Layout::kQpValid | qpn, std::memory_order_seq_cst);
    return false;
  }
  s.key.store(0, std::memory_order_seq_cst);
  target_slot_.erase(it);
  return true;
}

bool DirectTable::TargetHolders(uint32_t qpn, uint64_t holders[4]) const {
  const auto* s = FindTarget<Layout::TargetSlot>(qpn);
  if (s == nullptr) return false;
  for (int i = 0; i < 4; ++i) holders[i] = s->holders[i].load(std::memory_order_seq_cst);
  return true;
}

pid_t DirectTable::ProcessOf(uint8_t n) const {
  return Layout::initiators(base_)[n].pid.load(std::memory_order_relaxed);
}

void DirectTable::NoteProcess(uint8_t n, pid_t pid) {
  Layout::initiators(base_)[n].pid.store(pid, std::memory_order_relaxed);
}

void DirectTable::WithdrawTarget(uint32_t qpn) {
  std::lock_guard lock(mu_);
  Unpublish(target_slot_, Layout::targets(base_), qpn);
}

template <typename Slot>
Slot* DirectTable::FindTarget(uint32_t qpn) const {
  Slot* slots = Layout::targets(base_);
  const uint32_t home = Home(qpn, kTargetSlots);
  for (uint32_t i = 0; i < kProbe; ++i) {
    Slot& s = slots[(home + i) % kTargetSlots];
    if ((s.key.load(std::memory_order_seq_cst) & ~Layout::kClosing) == (Layout::kQpValid | qpn)) return &s;
  }
  return nullptr;
}

bool DirectTable::OpenTarget(uint32_t qpn, uint64_t domain, uint8_t me, pid_t self) {
  auto* s = FindTarget<Layout::TargetSlot>(qpn);
  if (s == nullptr || me == 0 || s->domain.load(std::memory_order_relaxed) != domain) return false;
  Layout::NoteNumber(Layout::initiators(base_)[me], self);
  const uint64_t bit = uint64_t{1} << (me % 64);
  s->holders[me / 64].fetch_or(bit, std::memory_order_seq_cst);
  // Our bit first, the key after (ReleaseTarget: the key first, the bits after).
  if (s->key.load(std::memory_order_seq_cst) == (Layout::kQpValid | qpn)) return true;
  s->holders[me / 64].fetch_and(~bit, std::memory_order_seq_cst);
  return false;
}

bool DirectTable::ReadTarget(uint32_t qpn, std::span<uint8_t> attributes) const {
  const auto* s = FindTarget<Layout::TargetSlot>(qpn);
  if (s == nullptr) return false;
  uint64_t words[kTargetAttributeBytes / 8];
  uint32_t bytes = 0;
  for (;;) {
    const uint32_t before = s->version.load(std::memory_order_acquire);
    if (before % 2 != 0) {
      std::this_thread::yield();
      continue;
    }
    for (size_t i = 0; i < std::size(words); ++i) words[i] = s->attributes[i].load(std::memory_order_relaxed);
    bytes = s->attribute_bytes.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s->version.load(std::memory_order_relaxed) == before) break;
  }
  const size_t n = std::min<size_t>(std::min<size_t>(bytes, kTargetAttributeBytes), attributes.size());
  if (n > 0) std::memcpy(attributes.data(), words, n);  // (an empty span may have no data: only a presence check)
  return true;
}

void DirectTable::CloseTarget(uint32_t qpn, uint8_t me) {
  if (auto* s = FindTarget<Layout::TargetSlot>(qpn); s != nullptr && me != 0)
    s->holders[me / 64].fetch_and(~(uint64_t{1} << (me % 64)), std::memory_order_seq_cst);
}

void DirectTable::Enter(uint8_t me, pid_t self) {
  Layout::Initiator& i = Layout::initiators(base_)[me];
  Layout::NoteNumber(i, self);
  i.entered.fetch_add(1, std::memory_order_seq_cst);
}

void DirectTable::Leave(uint8_t me) { Layout::initiators(base_)[me].left.fetch_add(1, std::memory_order_seq_cst); }

bool DirectTable::Responds(uint32_t dest_qpn, uint32_t src_qpn, uint32_t right, uint32_t* pd) const {
  const Layout::QpSlot* qp = Probe(Layout::qps(base_), kQpSlots, dest_qpn, Layout::kQpValid | dest_qpn);
  // The QP executes only its peer's requests, and only those its access flags allow (IBTA 9.7.5.1.x, 10.6.3.2).
  if (qp == nullptr || qp->peer_qpn != src_qpn || (qp->rights & right) == 0) return false;
  if (pd != nullptr) *pd = qp->pd;
  return true;
}

uint64_t DirectTable::Check(uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey, uint64_t va, uint64_t length,
                            uint32_t right) const {
  uint32_t pd = 0;
  if (!Responds(dest_qpn, src_qpn, right, &pd)) return 0;
  const Layout::RegionSlot* r = Probe(Layout::regions(base_), kRegionSlots, rkey, Layout::kRegionValid | rkey);
  // The R_Key's region: the QP's PD, [va, va+length) inside it, the right granted (10.6.3.2).
  if (r == nullptr || r->pd != pd || (r->rights & right) == 0 || va < r->iova || length > r->length ||
      va - r->iova > r->length - length)
    return 0;
  return r->host + (va - r->iova);
}

bool DirectTable::ClaimReceive(DirectSend* send, uint64_t length, uint32_t* slot) const {
  // Placed with the owner's own keys: the QP's PD does not matter here.
  if (!Responds(send->dest_qpn, send->src_qpn, direct_rights::kSend, nullptr)) return false;
  Layout::ReceiveSlot* slots = Layout::receives(base_);
  Layout::ReceiveSlot* s = Probe(slots, kReceiveSlots, send->dest_qpn, Layout::kQpValid | send->dest_qpn);
  if (s == nullptr) return false;
  // Stable while we look: packets_taken moves only for messages of ours (none in flight), `sends` only by us, and
  // the owner rewrites WQE i's length only for WQE i + kReceiveWindow, after it has taken WQE i.
  const uint64_t index = s->packets_taken.load(std::memory_order_acquire) + s->sends.load(std::memory_order_relaxed);
  if (index >= s->posted.load(std::memory_order_acquire) ||
      s->lengths[index % kReceiveWindow].load(std::memory_order_relaxed) < length)
    return false;
  send->epoch = s->epoch.load(std::memory_order_relaxed);
  send->index = index;
  *slot = uint32_t(s - slots);
  return true;
}

void DirectTable::CountSend(uint32_t slot) {
  Layout::ReceiveSlot& s = Layout::receives(base_)[slot % kReceiveSlots];
  s.sends.store(s.sends.load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
}

bool DirectTable::OfferCopy(uint8_t me, uint32_t rkey, uint64_t src, uint64_t there, uint64_t length) {
  Layout::Initiator& i = Layout::initiators(base_)[me];
  uint32_t none = uint32_t(Offer::kNone);
  if (me == 0 || !i.offer.compare_exchange_strong(none, uint32_t(Offer::kFilling), std::memory_order_seq_cst))
    return false;
  i.offer_rkey.store(rkey, std::memory_order_relaxed);
  i.offer_src.store(src, std::memory_order_relaxed);
  i.offer_there.store(there, std::memory_order_relaxed);
  i.offer_length.store(length, std::memory_order_relaxed);
  i.offer.store(uint32_t(Offer::kOffered), std::memory_order_seq_cst);
  return true;
}

DirectTable::Offer DirectTable::OfferOf(uint8_t me) const {
  return Offer(Layout::initiators(base_)[me].offer.load(std::memory_order_seq_cst));
}

bool DirectTable::WithdrawOffer(uint8_t me) {
  uint32_t offered = uint32_t(Offer::kOffered);
  return Layout::initiators(base_)[me].offer.compare_exchange_strong(offered, uint32_t(Offer::kNone),
                                                                    std::memory_order_seq_cst);
}

void DirectTable::ClearOffer(uint8_t me) {
  Layout::initiators(base_)[me].offer.store(uint32_t(Offer::kNone), std::memory_order_seq_cst);
}

bool DirectTable::TakeOffer(uint8_t n, uint64_t* src, uint64_t* there, uint64_t* length) {
  Layout::Initiator& i = Layout::initiators(base_)[n];
  uint32_t offered = uint32_t(Offer::kOffered);
  if (n == 0 || !i.offer.compare_exchange_strong(offered, uint32_t(Offer::kTaken), std::memory_order_seq_cst))
    return false;
  const uint32_t rkey = i.offer_rkey.load(std::memory_order_relaxed);
  *src = i.offer_src.load(std::memory_order_relaxed);
  *there = i.offer_there.load(std::memory_order_relaxed);
  *length = i.offer_length.load(std::memory_order_relaxed);
  const Layout::RegionSlot* r = Probe(Layout::regions(base_), kRegionSlots, rkey, Layout::kRegionValid | rkey);
  if (r == nullptr || (r->rights & direct_rights::kWrite) == 0 || *length == 0 || *there < r->host ||
      *length > r->length || *there - r->host > r->length - *length) {
    FinishOffer(n, false);
    return false;
  }
  return true;
}

void DirectTable::FinishOffer(uint8_t n, bool copied) {
  Layout::initiators(base_)[n].offer.store(uint32_t(copied ? Offer::kCopied : Offer::kFailed),
                                           std::memory_order_seq_cst);
}

void CopyOffer::Encode(uint8_t out[kSize]) const {
  std::memset(out, 0, kSize);
  out[0] = 'C';
  out[1] = owner;
}

std::optional<CopyOffer> CopyOffer::Decode(std::span<const uint8_t> in) {
  if (in.size() < kSize || in[0] != 'C') return std::nullopt;
  CopyOffer c;
  c.owner = in[1];
  return c;
}

void DirectSend::Encode(uint8_t out[kSize]) const {
  std::memset(out, 0, kSize);
  out[0] = 'S';
  out[1] = uint8_t((with_imm ? 1 : 0) | (solicited ? 2 : 0));
  std::memcpy(out + 4, &dest_qpn, 4);
  std::memcpy(out + 8, &src_qpn, 4);
  std::memcpy(out + 12, &epoch, 4);
  std::memcpy(out + 16, &index, 8);
  std::memcpy(out + 24, &imm, 4);
}

std::optional<DirectSend> DirectSend::Decode(std::span<const uint8_t> in) {
  if (in.size() < kSize || in[0] != 'S' || (in[1] & ~3) != 0) return std::nullopt;
  DirectSend d;
  d.with_imm = (in[1] & 1) != 0;
  d.solicited = (in[1] & 2) != 0;
  std::memcpy(&d.dest_qpn, in.data() + 4, 4);
  std::memcpy(&d.src_qpn, in.data() + 8, 4);
  std::memcpy(&d.epoch, in.data() + 12, 4);
  std::memcpy(&d.index, in.data() + 16, 8);
  std::memcpy(&d.imm, in.data() + 24, 4);
  return d;
}

void XrcDelivery::Encode(uint8_t out[kSize]) const {
  std::memset(out, 0, kSize);
  out[0] = 'X';
  out[1] = uint8_t((first ? 1 : 0) | (last ? 2 : 0) | (with_imm ? 4 : 0) | (solicited ? 8 : 0) | (abort ? 16 : 0) |
                  (resent ? 32 : 0));
  out[2] = status;
  std::memcpy(out + 4, &srqn, 4);
  std::memcpy(out + 8, &target_qpn, 4);
  std::memcpy(out + 12, &src_qpn, 4);
  std::memcpy(out + 16, &imm, 4);
  std::memcpy(out + 20, &psn, 4);
  std::memcpy(out + 24, &index, 8);
}

std::optional<XrcDelivery> XrcDelivery::Decode(std::span<const uint8_t> in) {
  if (in.size() < kSize || in[0] != 'X' || (in[1] & ~63) != 0) return std::nullopt;
  XrcDelivery d;
  d.first = (in[1] & 1) != 0;
  d.last = (in[1] & 2) != 0;
  d.with_imm = (in[1] & 4) != 0;
  d.solicited = (in[1] & 8) != 0;
  d.abort = (in[1] & 16) != 0;
  d.resent = (in[1] & 32) != 0;
  d.status = in[2];
  std::memcpy(&d.srqn, in.data() + 4, 4);
  std::memcpy(&d.target_qpn, in.data() + 8, 4);
  std::memcpy(&d.src_qpn, in.data() + 12, 4);
  std::memcpy(&d.imm, in.data() + 16, 4);
  std::memcpy(&d.psn, in.data() + 20, 4);
  std::memcpy(&d.index, in.data() + 24, 8);
  return d;
}

void XrcTargetModify::Encode(uint8_t out[kSize]) const {
  std::memset(out, 0, kSize);
  out[0] = 'M';
  out[1] = from;
  out[2] = answer ? 1 : 0;
  std::memcpy(out + 4, &request, 4);
  std::memcpy(out + 8, &qpn, 4);
  std::memcpy(out + 12, &mask, 4);
  std::memcpy(out + 16, &result, 4);
}

std::optional<XrcTargetModify> XrcTargetModify::Decode(std::span<const uint8_t> in) {
  if (in.size() < kSize || in[0] != 'M' || in[2] > 1) return std::nullopt;
  XrcTargetModify m;
  m.from = in[1];
  m.answer = in[2] == 1;
  std::memcpy(&m.request, in.data() + 4, 4);
  std::memcpy(&m.qpn, in.data() + 8, 4);
  std::memcpy(&m.mask, in.data() + 12, 4);
  std::memcpy(&m.result, in.data() + 16, 4);
  return m;
}

void XrcTargetEvent::Encode(uint8_t out[kSize]) const {
  std::memset(out, 0, kSize);
  out[0] = 'E';
  out[1] = event;
  std::memcpy(out + 4, &qpn, 4);
}

std::optional<XrcTargetEvent> XrcTargetEvent::Decode(std::span<const uint8_t> in) {
  if (in.size() < kSize || in[0] != 'E') return std::nullopt;
  XrcTargetEvent e;
  e.event = in[1];
  std::memcpy(&e.qpn, in.data() + 4, 4);
  return e;
}

namespace {

// At most this many pieces in one call (a send WR has at most max_send_sge; IOV_MAX is 1024).
constexpr size_t kMaxPieces = 64;

// process_vm_writev or process_vm_readv (`call`) of `pieces` here and [remote, remote+length) there: 1 when all
// `length` bytes were copied, 0 when fewer, -errno.
template <typename Piece, typename Call>
int CrossCopy(Call call, pid_t pid, uint64_t remote, std::span<const Piece> pieces, uint64_t length) {
  if (pieces.size() > kMaxPieces) return -EINVAL;
  iovec local[kMaxPieces];
  size_t n = 0;
  for (const Piece& p : pieces) {
    if (!p.empty()) local[n++] = {const_cast<uint8_t*>(p.data()), p.size()};
  }
  iovec there = {reinterpret_cast<void*>(remote), length};
  const ssize_t r = call(pid, local, n, &there, 1, 0);
  if (r < 0) return -errno;
  return uint64_t(r) == length;
}

}  // namespace

int CopyToProcess(pid_t pid, uint64_t remote, std::span<const std::span<const uint8_t>> pieces, uint64_t length) {
  return CrossCopy(process_vm_writev, pid, remote, pieces, length);
}

int CopyFromProcess(pid_t pid, uint64_t remote, std::span<const std::span<uint8_t>> pieces, uint64_t length) {
  return CrossCopy(process_vm_readv, pid, remote, pieces, length);
}

}  // namespace uroce::wire
