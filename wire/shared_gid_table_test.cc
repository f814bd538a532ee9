#include "wire/shared_gid_table.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "wire/sealed_memfd.h"

namespace uroce::wire {
namespace {

TEST(SharedGidTable, AProcessReadsWhatTheServicePublishes) {
  std::unique_ptr<SharedGidTable> service, process;
  ASSERT_EQ(SharedGidTable::Create(&service), 0);
  ASSERT_EQ(SharedGidTable::Attach(service->fd(), &process), 0);
  SharedGidTable::Entries got;
  const uint32_t empty = process->Read(&got);
  for (const auto& e : got) EXPECT_FALSE(e);
  SharedGidTable::Entries table;
  table[0] = IpAddress::V4(0x0a000001);
  table[2] = *IpAddress::Parse("fd00::7");
  service->Publish(table);
  const uint32_t seq = process->Read(&got);
  EXPECT_NE(seq, empty);
  EXPECT_EQ(seq % 2, 0u);
  EXPECT_EQ(got, table);
}

// Only the service's mapping writes: the file refuses another writable mapping (F_SEAL_FUTURE_WRITE), and a file
// that is not a table is refused.
TEST(SharedGidTable, NoProcessCanWriteItAndOtherFilesAreNotTables) {
  std::unique_ptr<SharedGidTable> service, process;
  ASSERT_EQ(SharedGidTable::Create(&service), 0);
  void* base = nullptr;
  size_t bytes = 0;
  EXPECT_EQ(MapSealedMemfd(service->fd(), &base, &bytes, /*writable=*/true), -EPERM);
  int other = -1;
  ASSERT_EQ(CreateSealedMemfd("not-a-table", 4096, &base, &other), 0);
  EXPECT_EQ(SharedGidTable::Attach(other, &process), -EINVAL);
  munmap(base, 4096);
  close(other);
}

// A waiter sleeps until the table changes (a Publish in another thread, as the service's in another process would
// be), or until Wake.
TEST(SharedGidTable, AWaiterWakesWhenTheTableChangesOrIsWoken) {
  std::unique_ptr<SharedGidTable> service, process;
  ASSERT_EQ(SharedGidTable::Create(&service), 0);
  ASSERT_EQ(SharedGidTable::Attach(service->fd(), &process), 0);
  SharedGidTable::Entries got;
  const uint32_t seen = process->Read(&got);
  std::thread waiter([&] {
    uint32_t now = seen;
    while (now == seen) {
      process->WaitForChange(seen);
      now = process->Read(&got);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // most likely asleep by now; correct either way
  SharedGidTable::Entries table;
  table[1] = IpAddress::V4(0x0a000002);
  service->Publish(table);
  waiter.join();
  EXPECT_EQ(got, table);
  // Wake alone: WaitForChange returns though nothing changed.
  std::atomic<bool> returned{false};
  std::thread woken([&] {
    process->WaitForChange(process->Read(&got));
    returned = true;
  });
  for (int i = 0; i < 200 && !returned; ++i) {
    process->Wake();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  woken.join();
  EXPECT_TRUE(returned);
}

}  // namespace
}  // namespace uroce::wire
