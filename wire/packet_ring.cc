#include "wire/packet_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "wire/sealed_memfd.h"

namespace uroce::wire {

PacketRing::PacketRing(uint8_t* base, size_t map_bytes, size_t data_bytes)
    : base_(base), map_bytes_(map_bytes), data_bytes_(data_bytes) {}

PacketRing::~PacketRing() { munmap(base_, map_bytes_); }

int PacketRing::Create(size_t data_bytes, std::unique_ptr<PacketRing>* ring, int* fd) {
  if (data_bytes < (size_t{64} << 10) || (data_bytes & (data_bytes - 1)) != 0) return -EINVAL;
  const size_t map_bytes = kDataOffset + data_bytes;
  void* base = nullptr;
  int f = -1;
  if (int rc = CreateSealedMemfd("uroce-packet-ring", map_bytes, &base, &f); rc < 0) return rc;
  auto* bytes = static_cast<uint8_t*>(base);
  const uint64_t header[2] = {kMagic, data_bytes};
  std::memcpy(bytes, header, sizeof header);  // head, tail and sleeping start at 0 (a new file is zeroed)
  ring->reset(new PacketRing(bytes, map_bytes, data_bytes));
  *fd = f;
  return 0;
}

int PacketRing::Attach(int fd, std::unique_ptr<PacketRing>* ring) {
  void* base = nullptr;
  size_t map_bytes = 0;
  if (int rc = MapSealedMemfd(fd, &base, &map_bytes); rc < 0) return rc;
  if (map_bytes <= kDataOffset) {
    munmap(base, map_bytes);
    return -EINVAL;
  }
  uint64_t header[2];
  std::memcpy(header, base, sizeof header);
  const size_t data_bytes = size_t(header[1]);
  if (header[0] != kMagic || data_bytes != map_bytes - kDataOffset || (data_bytes & (data_bytes - 1)) != 0 ||
      data_bytes < (size_t{64} << 10)) {
    munmap(base, map_bytes);
    return -EINVAL;
  }
  ring->reset(new PacketRing(static_cast<uint8_t*>(base), map_bytes, data_bytes));
  // A ring attached late (a producer that reconnected) continues where the published records end.
  (*ring)->write_pos_ = (*ring)->head().load(std::memory_order_acquire);
  (*ring)->tail_seen_ = (*ring)->tail().load(std::memory_order_acquire);
  return 0;
}

bool PacketRing::Write(std::span<const uint8_t> first, std::span<const uint8_t> second) {
  const std::span<const uint8_t> rest[1] = {second};
  return WriteGathered(first, rest);
}

bool PacketRing::WriteGathered(std::span<const uint8_t> first, std::span<const std::span<const uint8_t>> rest) {
  size_t length = first.size();
  for (const auto& piece : rest) length += piece.size();
  const size_t record = RecordBytes(length);
  if (record > data_bytes_ / 2) return false;  // a record and the padding before it always fit an empty ring
  const size_t offset = size_t(write_pos_ & (data_bytes_ - 1));
  size_t padding = record > data_bytes_ - offset ? data_bytes_ - offset : 0;
  // Past kEarlyWrapBytes, every 16th write looks whether the consumer has taken enough that kEarlyWrapBytes would
  // stay free; if so, back to offset 0 (the padding record fills the rest, untouched but for its header). Not every
  // write: the consumer's tail is on the consumer's cache line.
  if (padding == 0 && offset >= kEarlyWrapBytes && data_bytes_ > kEarlyWrapBytes &&
      (++writes_past_early_wrap_ & 15) == 1) {
    if (tail_seen_ != write_pos_) tail_seen_ = tail().load(std::memory_order_acquire);
    if (write_pos_ - tail_seen_ + kEarlyWrapBytes <= offset) padding = data_bytes_ - offset;
  }
  auto fits = [&] { return write_pos_ + padding + record - tail_seen_ <= data_bytes_; };
  if (!fits()) {
    tail_seen_ = tail().load(std::memory_order_acquire);  // the consumer is done with what lies before its tail
    if (!fits()) return false;
  }
  if (padding != 0) {
    const uint32_t pad[2] = {uint32_t(padding - kRecordHeader), kRecordPadding};
    std::memcpy(data() + offset, pad, sizeof pad);
    write_pos_ += padding;
  }
  const size_t at_offset = size_t(write_pos_ & (data_bytes_ - 1));
  if (at_offset == 0) writes_past_early_wrap_ = 0;
  furthest_offset_ = std::max(furthest_offset_, at_offset + record);
  uint8_t* at = data() + at_offset;
  const uint32_t header[2] = {uint32_t(length), kRecordPacket};
  std::memcpy(at, header, sizeof header);
  uint8_t* to = at + kRecordHeader;
  if (!first.empty()) to = static_cast<uint8_t*>(std::memcpy(to, first.data(), first.size())) + first.size();
  for (const auto& piece : rest) {
    if (!piece.empty()) to = static_cast<uint8_t*>(std::memcpy(to, piece.data(), piece.size())) + piece.size();
  }
  write_pos_ += record;
  return true;
}

bool PacketRing::Publish() {
  head().store(write_pos_, std::memory_order_seq_cst);
  // Sequentially consistent with the consumer's SetSleeping(true) and its HasRecords() after it: either it sees our
  // records, or we see its flag.
  if (sleeping().load(std::memory_order_seq_cst) == 0) return false;
  return sleeping().exchange(0, std::memory_order_seq_cst) != 0;  // one doorbell per sleep, not one per producer
}

bool PacketRing::HasRecords() const { return head().load(std::memory_order_seq_cst) != read_pos_; }

void PacketRing::SetSleeping(bool sleeping_now) { sleeping().store(sleeping_now ? 1 : 0, std::memory_order_seq_cst); }

int TakeDoorbell(int fd) {
  // An eventfd is an anonymous inode: no file type in its mode. Pipes, sockets, FIFOs and files have one; the other
  // anonymous inodes (timerfd, signalfd, epoll) refuse an 8-byte write at once.
  struct stat st;
  if (fstat(fd, &st) < 0) return -errno;
  if ((st.st_mode & S_IFMT) != 0) return -EINVAL;
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return -errno;
  return 0;
}

}  // namespace uroce::wire
