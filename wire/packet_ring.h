// PacketRing: one process's packets to another process of the same host, in shared memory (docs/ARCHITECTURE.md,
// "The host device"). A single-producer, single-consumer ring of variable-length records in a memfd that the
// receiving process creates and passes to the sending one (SCM_RIGHTS): one ring per (sender, receiver) pair, so a
// sender that dies half-way through a record stalls nobody else's packets (an MPSC ring would stall its consumer at
// the dead producer's claimed slot).
//
// Each record is a whole datagram as the sender hands it over (wire/service_protocol.h's ForwardHeader, then the
// RoCEv2 packet): the receiver decodes, checks the ICRC and fault-injects exactly as for packets that came by UDP.
//
// Layout of the shared memory (all offsets from the start of the mapping; both ends run on one host, so host byte
// order):
//   0    magic u64, data bytes u64                          (written once by the creator)
//   64   head u64: bytes ever written (the producer's)      (own cache line: the two ends never write one line)
//   128  tail u64: bytes ever consumed (the consumer's), sleeping u32: the consumer is about to block
//   4096 data: records of  length u32 | kind u32 | bytes, each padded to 8 bytes; a record never wraps: when one
//        does not fit before the end, a padding record fills the rest and it starts at offset 0.
//
// Sleeping (Dekker's pattern, both sides sequentially consistent): a consumer that found the ring empty sets
// `sleeping`, looks once more, and only then blocks on its doorbell (an eventfd). A producer publishes `head`, then
// takes `sleeping` (exchange to 0) and rings the doorbell if it was set. So a wake-up is one write(2) and happens
// only when the consumer really sleeps; a spinning consumer costs its producers nothing.
//
// Trust: both ends run as the same user (the peer connection checks SO_PEERCRED). Still, the consumer copies each
// record's length before using it and refuses a ring whose records do not add up (Drain returns -EPROTO), so a
// confused or dying producer cannot make the consumer read outside the mapping. The memfd is sealed against
// shrinking and growing (memfd_create(2): a shrunk file would SIGBUS its mapper).
//
// Error contract (as liburing's): functions that can fail return 0 or a count on success, -errno on failure.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace uroce::wire {

class PacketRing {
 public:
  // What the creator asks for when nothing else is said: room for 4,000 4 KiB-MTU packets, more than the RC windows
  // towards one peer keep in flight (ib_write_bw 64 KiB dropped packets, and went back, with a ring of 4 MiB), so
  // that a full ring (a drop, as a full socket buffer) means a receiver that stopped taking packets.
  static constexpr size_t kDefaultDataBytes = size_t{16} << 20;
  // But little of it is touched: a producer past kEarlyWrapBytes starts again at offset 0 as soon as that would
  // still leave kEarlyWrapBytes free (what the consumer has not taken, plus the padding to the end, is in use until it
  // has). So a stream touches what it keeps in flight plus kEarlyWrapBytes, and a pair that exchanges small messages
  // kEarlyWrapBytes, whatever the ring's size: going round all 16 MiB, a 64 KiB ib_write_bw stream spent half of its
  // sending thread copying into memory no cache held (2.6 GB/s; 3.5 with a 2 MiB ring). kEarlyWrapBytes is what the
  // largest RC window towards one peer keeps in flight (emu::PathWindow::kMax, 512 packets of the 4 KiB MTU), with
  // room for their headers and the peer's ACKs: a window sent at once just after a wrap still fits.
  static constexpr size_t kEarlyWrapBytes = size_t{3} << 20;
  static constexpr uint64_t kMagic = 0x75726f63'6552696eULL;  // "urocRin"

  // The consumer's side: a new ring of `data_bytes` (a power of two, at least 64 KiB) in a new sealed memfd, whose
  // descriptor (close-on-exec, the caller's) is stored in *fd for passing to the producer. -errno of memfd_create,
  // ftruncate, fcntl or mmap; -EINVAL for a bad size.
  static int Create(size_t data_bytes, std::unique_ptr<PacketRing>* ring, int* fd);
  // The producer's side: maps the ring in memfd `fd` (not taken: the caller closes it). -EINVAL when the file is
  // not a ring (not a memfd sealed against shrinking; size, magic, data size disagree); -errno of fstat or mmap.
  static int Attach(int fd, std::unique_ptr<PacketRing>* ring);

  ~PacketRing();
  PacketRing(const PacketRing&) = delete;
  PacketRing& operator=(const PacketRing&) = delete;

  // --- producer (one thread at a time) ---
  // Appends one record made of `first` then `second` (not yet visible to the consumer). false when it does not fit
  // now (the ring is full) or ever (larger than the ring).
  bool Write(std::span<const uint8_t> first, std::span<const uint8_t> second);
  // The same, of `first` then each of `rest` in order.
  bool WriteGathered(std::span<const uint8_t> first, std::span<const std::span<const uint8_t>> rest);
  // Makes the records written so far visible. Returns true when the consumer was asleep (or about to be): the
  // caller rings its doorbell.
  bool Publish();
  // Whether the consumer said it is about to block on its doorbell and no producer has rung it since.
  bool ConsumerAsleep() const { return sleeping().load(std::memory_order_relaxed) != 0; }

  // --- consumer (one thread at a time) ---
  // Calls `on_record(bytes)` for up to `max` published records, oldest first, then hands their room back to the
  // producer. The bytes are valid only during the call. Returns how many, or -EPROTO for a ring whose records are
  // malformed (the consumer should stop using it).
  template <typename OnRecord>
  int Drain(size_t max, OnRecord&& on_record);
  // Whether a published record is waiting.
  bool HasRecords() const;
  // The consumer is about to block on its doorbell (true), or is awake again (false). After SetSleeping(true), check
  // HasRecords() before blocking: a record published before the producer saw the flag would ring no doorbell.
  void SetSleeping(bool sleeping);

  size_t data_bytes() const { return data_bytes_; }
  // The producer's furthest offset in the data so far (kEarlyWrapBytes).
  size_t furthest_offset() const { return furthest_offset_; }

 private:
  PacketRing(uint8_t* base, size_t map_bytes, size_t data_bytes);
  static constexpr size_t kHeadOffset = 64, kTailOffset = 128, kSleepingOffset = 136, kDataOffset = 4096;
  static constexpr uint32_t kRecordPacket = 1, kRecordPadding = 2;
  static constexpr size_t kRecordHeader = 8;
  static size_t RecordBytes(size_t length) { return (kRecordHeader + length + 7) & ~size_t{7}; }

  std::atomic_ref<uint64_t> head() const {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base_ + kHeadOffset));
  }
  std::atomic_ref<uint64_t> tail() const {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base_ + kTailOffset));
  }
  std::atomic_ref<uint32_t> sleeping() const {
    return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(base_ + kSleepingOffset));
  }
  uint8_t* data() const { return base_ + kDataOffset; }

  uint8_t* base_;
  size_t map_bytes_;
  size_t data_bytes_;
  uint64_t write_pos_ = 0;    // producer: next byte to write (published up to head)
  uint64_t tail_seen_ = 0;    // producer: the consumer's tail when last read
  uint64_t read_pos_ = 0;     // consumer: next byte to read
  size_t furthest_offset_ = 0;
  unsigned writes_past_early_wrap_ = 0;
};

// A ring's doorbell as its consumer passed it: 0 when `fd` is an eventfd (an anonymous inode), which it then makes
// non-blocking, so that a write can never block the producer whatever the consumer did to the counter; -EINVAL for a
// pipe, socket, FIFO or file (any could block the producer that rings it: the device service, every process's);
// -errno of fstat/fcntl.
int TakeDoorbell(int fd);

template <typename OnRecord>
int PacketRing::Drain(size_t max, OnRecord&& on_record) {
  const uint64_t published = head().load(std::memory_order_acquire);
  uint64_t pos = read_pos_;
  int taken = 0;
  while (pos != published && size_t(taken) < max) {
    const size_t offset = size_t(pos & (data_bytes_ - 1));
    uint32_t length, kind;
    __builtin_memcpy(&length, data() + offset, 4);  // copied once: the producer's memory may change under us
    __builtin_memcpy(&kind, data() + offset + 4, 4);
    const size_t record = RecordBytes(length);
    if ((kind != kRecordPacket && kind != kRecordPadding) || record > data_bytes_ - offset ||
        record > published - pos) {
      return -EPROTO;
    }
    if (kind == kRecordPacket) {
      on_record(std::span<const uint8_t>(data() + offset + kRecordHeader, length));
      ++taken;
    }
    pos += record;
  }
  if (pos != read_pos_) {
    read_pos_ = pos;
    tail().store(pos, std::memory_order_release);  // the records' room goes back only after their handlers ran
  }
  return taken;
}

}  // namespace uroce::wire
