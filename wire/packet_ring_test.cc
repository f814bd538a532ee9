#include "wire/packet_ring.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace uroce::wire {
namespace {

constexpr size_t kSmall = size_t{64} << 10;

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed * 131 + i * 7);
  return v;
}

struct Pair {
  std::unique_ptr<PacketRing> consumer, producer;
  int fd = -1;
  explicit Pair(size_t bytes = kSmall) {
    EXPECT_EQ(PacketRing::Create(bytes, &consumer, &fd), 0);
    EXPECT_EQ(PacketRing::Attach(fd, &producer), 0);  // a mapping of its own, as another process has
  }
  ~Pair() { close(fd); }
};

TEST(PacketRingTest, RecordsArriveWholeAndInOrder) {
  Pair p;
  const auto a = Pattern(40, 1), b = Pattern(1000, 2), c = Pattern(3, 3);
  ASSERT_TRUE(p.producer->Write(a, b));
  ASSERT_TRUE(p.producer->Write(c, {}));
  EXPECT_FALSE(p.consumer->HasRecords());  // written, not yet published
  EXPECT_FALSE(p.producer->Publish());     // nobody sleeps: no doorbell
  ASSERT_TRUE(p.consumer->HasRecords());
  std::vector<std::vector<uint8_t>> got;
  EXPECT_EQ(p.consumer->Drain(16, [&](std::span<const uint8_t> r) { got.emplace_back(r.begin(), r.end()); }), 2);
  ASSERT_EQ(got.size(), 2u);
  std::vector<uint8_t> ab = a;
  ab.insert(ab.end(), b.begin(), b.end());
  EXPECT_EQ(got[0], ab);
  EXPECT_EQ(got[1], c);
  EXPECT_FALSE(p.consumer->HasRecords());
  EXPECT_EQ(p.consumer->Drain(16, [](std::span<const uint8_t>) {}), 0);
}

TEST(PacketRingTest, FullRingRefusesUntilTheConsumerTakes) {
  Pair p;
  const auto packet = Pattern(4136, 9);
  int written = 0;
  while (p.producer->Write(packet, {})) ++written;
  EXPECT_EQ(written, int(kSmall / 4144));  // 8 bytes of record header each
  int small = 0;
  while (p.producer->Write(Pattern(8, 1), {})) ++small;
  EXPECT_EQ(small, int((kSmall - written * 4144) / 16)) << "the rest of the room, to the last byte";
  p.producer->Publish();
  EXPECT_EQ(p.consumer->Drain(2, [](std::span<const uint8_t>) {}), 2);
  EXPECT_TRUE(p.producer->Write(packet, {}));  // the room of the two taken, after the producer looks again
  EXPECT_FALSE(p.producer->Write(Pattern(kSmall / 2, 1), {})) << "larger than half the ring never fits";
}

TEST(PacketRingTest, WrapsWithPaddingAcrossManyLaps) {
  Pair p;
  uint32_t next_written = 0, next_read = 0;
  for (int round = 0; round < 2000; ++round) {
    while (true) {
      uint8_t header[4];
      std::memcpy(header, &next_written, 4);
      const auto body = Pattern(1 + (next_written * 977) % 5000, next_written);  // odd sizes: every offset
      if (!p.producer->Write(header, body)) break;
      ++next_written;
    }
    p.producer->Publish();
    const int n = p.consumer->Drain(1 + round % 7, [&](std::span<const uint8_t> r) {
      uint32_t seq;
      ASSERT_GE(r.size(), 5u);
      std::memcpy(&seq, r.data(), 4);
      ASSERT_EQ(seq, next_read);
      ASSERT_EQ(std::vector<uint8_t>(r.begin() + 4, r.end()), Pattern(1 + (seq * 977) % 5000, seq));
      ++next_read;
    });
    ASSERT_GT(n, 0);
  }
  EXPECT_GT(next_read, 2000u);
}

TEST(PacketRingTest, SmallExchangesStayAtTheStartOfALargeRing) {
  Pair p(PacketRing::kDefaultDataBytes);
  const auto packet = Pattern(1100, 4);
  for (int i = 0; i < 20'000; ++i) {  // 22 MB through a 16 MiB ring, one record at a time
    ASSERT_TRUE(p.producer->Write(packet, {}));
    p.producer->Publish();
    ASSERT_EQ(p.consumer->Drain(4, [&](std::span<const uint8_t> r) { ASSERT_EQ(r.size(), packet.size()); }), 1);
  }
  EXPECT_LT(p.producer->furthest_offset(), PacketRing::kEarlyWrapBytes + 16 * 1200);
}

// A stream keeps a window of records in flight (here 1 MiB of 4 KiB packets, as an RC window does): the producer
// starts again at offset 0 whenever kEarlyWrapBytes would stay free, so it touches what is in flight plus that much,
// not all 16 MiB, and never refuses a record; nor does it then refuse the largest window sent at once.
TEST(PacketRingTest, AStreamTouchesItsWindowAndTheWrapRoomOnly) {
  Pair p(PacketRing::kDefaultDataBytes);
  const auto packet = Pattern(4136, 5);
  constexpr size_t kWindow = 256;  // records in flight: 1 MiB
  size_t in_flight = 0;
  for (int i = 0; i < 40'000; ++i) {  // 165 MB through the ring
    ASSERT_TRUE(p.producer->Write(packet, {})) << "record " << i;
    p.producer->Publish();
    if (++in_flight < kWindow) continue;
    // The consumer takes half the window at a time: what is in flight moves between half and all of it.
    in_flight -= size_t(p.consumer->Drain(kWindow / 2, [&](std::span<const uint8_t> r) {
      ASSERT_EQ(r.size(), packet.size());
    }));
  }
  EXPECT_LT(p.producer->furthest_offset(), kWindow * 4160 + PacketRing::kEarlyWrapBytes + 16 * 4160);
  // 512 packets: emu::PathWindow::kMax, on top of what the stream has in flight.
  for (size_t i = 0; i < 512; ++i) ASSERT_TRUE(p.producer->Write(packet, {})) << "burst record " << i;
}

TEST(PacketRingTest, ProducerAndConsumerThreads) {
  Pair p(size_t{256} << 10);
  constexpr uint32_t kRecords = 200'000;
  std::thread producer([&] {
    for (uint32_t i = 0; i < kRecords;) {
      uint8_t header[4];
      std::memcpy(header, &i, 4);
      const uint8_t fill = uint8_t(i);
      std::vector<uint8_t> body(i % 300, fill);
      if (p.producer->Write(header, body)) {
        ++i;
        if (i % 16 == 0) p.producer->Publish();
      } else {
        p.producer->Publish();
        std::this_thread::yield();
      }
    }
    p.producer->Publish();
  });
  uint32_t expected = 0;
  bool intact = true;
  while (expected < kRecords) {
    const int n = p.consumer->Drain(64, [&](std::span<const uint8_t> r) {
      uint32_t seq = 0;
      if (r.size() >= 4) std::memcpy(&seq, r.data(), 4);
      intact = intact && r.size() == 4 + seq % 300 && seq == expected;
      for (size_t k = 4; k < r.size(); ++k) intact = intact && r[k] == uint8_t(seq);
      ++expected;
    });
    ASSERT_GE(n, 0);
    if (n == 0) std::this_thread::yield();
  }
  producer.join();
  EXPECT_TRUE(intact);
  EXPECT_FALSE(p.consumer->HasRecords());
}

TEST(PacketRingTest, SleepingConsumerGetsOneDoorbell) {
  Pair p;
  p.consumer->SetSleeping(true);
  ASSERT_TRUE(p.producer->Write(Pattern(10, 1), {}));
  EXPECT_TRUE(p.producer->Publish()) << "the consumer sleeps: ring its doorbell";
  ASSERT_TRUE(p.producer->Write(Pattern(10, 2), {}));
  EXPECT_FALSE(p.producer->Publish()) << "one doorbell per sleep";
  p.consumer->SetSleeping(false);
  EXPECT_EQ(p.consumer->Drain(8, [](std::span<const uint8_t>) {}), 2);
}

TEST(PacketRingTest, MalformedRecordsAreRefusedNotRead) {
  Pair p;
  ASSERT_TRUE(p.producer->Write(Pattern(100, 1), {}));
  p.producer->Publish();
  // A raw mapping, as a confused producer has: the record claims to be longer than what was published.
  void* raw = mmap(nullptr, 4096 + kSmall, PROT_READ | PROT_WRITE, MAP_SHARED, p.fd, 0);
  ASSERT_NE(raw, MAP_FAILED);
  const uint32_t huge = 60000;
  std::memcpy(static_cast<uint8_t*>(raw) + 4096, &huge, 4);
  int calls = 0;
  EXPECT_EQ(p.consumer->Drain(8, [&](std::span<const uint8_t>) { ++calls; }), -EPROTO);
  const uint32_t bad_kind[2] = {100, 77};
  std::memcpy(static_cast<uint8_t*>(raw) + 4096, bad_kind, 8);
  EXPECT_EQ(p.consumer->Drain(8, [&](std::span<const uint8_t>) { ++calls; }), -EPROTO);
  EXPECT_EQ(calls, 0);
  munmap(raw, 4096 + kSmall);
}

TEST(PacketRingTest, OnlyRingsAttachAndTheirSizeIsSealed) {
  std::unique_ptr<PacketRing> ring;
  int fd = -1;
  EXPECT_EQ(PacketRing::Create(100'000, &ring, &fd), -EINVAL);  // not a power of two
  EXPECT_EQ(PacketRing::Create(4096, &ring, &fd), -EINVAL);     // too small
  ASSERT_EQ(PacketRing::Create(kSmall, &ring, &fd), 0);
  EXPECT_EQ(ftruncate(fd, 8192), -1) << "a peer must not shrink the consumer's mapping under it";
  EXPECT_EQ(errno, EPERM);
  close(fd);
  const int other = memfd_create("not-a-ring", MFD_CLOEXEC);
  ASSERT_GE(other, 0);
  ASSERT_EQ(ftruncate(other, 4096 + kSmall), 0);
  std::unique_ptr<PacketRing> attached;
  EXPECT_EQ(PacketRing::Attach(other, &attached), -EINVAL);
  close(other);
  // A ring's bytes in a memfd that is not sealed: whoever holds it could shrink it under the mapping (SIGBUS).
  std::unique_ptr<PacketRing> real;
  int real_fd = -1;
  ASSERT_EQ(PacketRing::Create(kSmall, &real, &real_fd), 0);
  const int unsealed = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(unsealed, 4096 + kSmall), 0);
  void* from = mmap(nullptr, 4096 + kSmall, PROT_READ, MAP_SHARED, real_fd, 0);
  ASSERT_EQ(pwrite(unsealed, from, 4096, 0), 4096);  // a valid header
  munmap(from, 4096 + kSmall);
  EXPECT_EQ(PacketRing::Attach(unsealed, &attached), -EINVAL);
  close(unsealed);
  close(real_fd);
}

TEST(PacketRingTest, OnlyAnEventFdIsADoorbell) {
  const int bell = eventfd(0, EFD_CLOEXEC);  // blocking, as a careless consumer might pass it
  ASSERT_GE(bell, 0);
  EXPECT_EQ(TakeDoorbell(bell), 0);
  EXPECT_NE(fcntl(bell, F_GETFL) & O_NONBLOCK, 0) << "a full counter must refuse, not block, its producer";
  const uint64_t almost_full = 0xfffffffffffffffeULL;
  ASSERT_EQ(write(bell, &almost_full, 8), 8);
  const uint64_t one = 1;
  EXPECT_EQ(write(bell, &one, 8), -1);
  EXPECT_EQ(errno, EAGAIN);
  close(bell);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  EXPECT_EQ(TakeDoorbell(pipe_fds[1]), -EINVAL) << "a pipe could block the producer once full";
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  const int file = memfd_create("file", MFD_CLOEXEC);
  EXPECT_EQ(TakeDoorbell(file), -EINVAL);
  close(file);
}

}  // namespace
}  // namespace uroce::wire
