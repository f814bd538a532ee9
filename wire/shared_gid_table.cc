#include "wire/shared_gid_table.h"

#include <fcntl.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>

#include "wire/sealed_memfd.h"

namespace uroce::wire {

// Every word is an atomic: readers copy while the writer may be changing them, and the sequence tells them to copy
// again (a seqlock whose data races would otherwise be undefined behaviour).
struct SharedGidTable::Layout {
  static constexpr uint32_t kMagic = 0x47494454;  // "GIDT"
  std::atomic<uint32_t> seq;  // odd while the service writes; the futex word
  uint32_t magic;
  struct Entry {
    std::atomic<uint64_t> present;
    std::atomic<uint64_t> bytes[2];  // the address's 16 bytes (IPv4-mapped for IPv4)
  } entries[kEntries];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "shared between processes: the atomics must be plain words");

namespace {

long Futex(const std::atomic<uint32_t>* word, int op, uint32_t value) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), op, value, nullptr, nullptr, 0);
}

}  // namespace

SharedGidTable::~SharedGidTable() {
  munmap(layout_, sizeof(Layout));
  if (fd_ >= 0) close(fd_);
}

int SharedGidTable::Create(std::unique_ptr<SharedGidTable>* out) {
  void* base = nullptr;
  int fd = -1;
  if (int rc = CreateSealedMemfd("uroce-gid-table", sizeof(Layout), &base, &fd, F_SEAL_FUTURE_WRITE); rc < 0) return rc;
  auto* layout = static_cast<Layout*>(base);
  layout->magic = Layout::kMagic;
  out->reset(new SharedGidTable(layout, fd));
  return 0;
}

int SharedGidTable::Attach(int fd, std::unique_ptr<SharedGidTable>* out) {
  void* base = nullptr;
  size_t bytes = 0;
  if (int rc = MapSealedMemfd(fd, &base, &bytes, /*writable=*/false); rc < 0) return rc;
  auto* layout = static_cast<Layout*>(base);
  if (bytes != sizeof(Layout) || layout->magic != Layout::kMagic) {
    munmap(base, bytes);
    return -EINVAL;
  }
  out->reset(new SharedGidTable(layout, -1));
  return 0;
}

void SharedGidTable::Publish(const Entries& entries) {
  const uint32_t seq = layout_->seq.load(std::memory_order_relaxed);
  layout_->seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (size_t i = 0; i < kEntries; ++i) {
    Layout::Entry& e = layout_->entries[i];
    uint64_t words[2] = {};
    if (entries[i]) std::memcpy(words, entries[i]->bytes().data(), 16);
    e.present.store(entries[i] ? 1 : 0, std::memory_order_relaxed);
    e.bytes[0].store(words[0], std::memory_order_relaxed);
    e.bytes[1].store(words[1], std::memory_order_relaxed);
  }
  layout_->seq.store(seq + 2, std::memory_order_release);
  Wake();
}

uint32_t SharedGidTable::Read(Entries* entries) const {
  // A service killed in the middle of Publish leaves the sequence odd for good: after a second of that, the entries
  // as they are, with the odd sequence (the device fails with its service anyway: IBV_EVENT_DEVICE_FATAL).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (;;) {
    const uint32_t before = layout_->seq.load(std::memory_order_acquire);
    const bool torn = (before & 1) != 0;
    if (torn && std::chrono::steady_clock::now() < give_up) {
      sched_yield();
      continue;
    }
    for (size_t i = 0; i < kEntries; ++i) {
      const Layout::Entry& e = layout_->entries[i];
      const uint64_t words[2] = {e.bytes[0].load(std::memory_order_relaxed),
                                 e.bytes[1].load(std::memory_order_relaxed)};
      if (e.present.load(std::memory_order_relaxed)) {
        (*entries)[i] = IpAddress::FromBytes(reinterpret_cast<const uint8_t*>(words));
      } else {
        (*entries)[i].reset();
      }
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (torn || layout_->seq.load(std::memory_order_relaxed) == before) return before;
  }
}

void SharedGidTable::WaitForChange(uint32_t seen) const { Futex(&layout_->seq, FUTEX_WAIT, seen); }

void SharedGidTable::Wake() const { Futex(&layout_->seq, FUTEX_WAKE, INT_MAX); }

}  // namespace uroce::wire
