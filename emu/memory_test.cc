#include "emu/memory.h"

#include <gtest/gtest.h>

#include "emu/types.h"

namespace uroce::emu {
namespace {

TEST(KeyTable, ChecksKeyPdBoundsAndRights) {
  ProtectionDomain pd(1), other(2);
  uint8_t buf[100];
  KeyTable keys;
  MemoryRegion mr = keys.Register({&pd, buf, 0x1000, sizeof buf, access::kLocalWrite | access::kRemoteRead});
  EXPECT_NE(mr.lkey, 0u);
  auto ok = keys.CheckRemote(mr.rkey, &pd, 0x1000 + 10, 90, access::kRemoteRead);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.host, buf + 10);
  EXPECT_EQ(keys.CheckRemote(mr.rkey, &pd, 0x1000 + 10, 91, access::kRemoteRead).error, AccessError::kOutOfBounds);
  EXPECT_EQ(keys.CheckRemote(mr.rkey, &pd, 0xfff, 1, access::kRemoteRead).error, AccessError::kOutOfBounds);
  EXPECT_EQ(keys.CheckRemote(mr.rkey, &pd, 0x1000, 8, access::kRemoteWrite).error, AccessError::kNoPermission);
  EXPECT_EQ(keys.CheckRemote(mr.rkey, &other, 0x1000, 8, access::kRemoteRead).error, AccessError::kWrongPd);
  EXPECT_EQ(keys.CheckRemote(mr.rkey + 1, &pd, 0x1000, 8, access::kRemoteRead).error, AccessError::kBadKey);
  // Overflowing va + len must not wrap into the region.
  EXPECT_EQ(keys.CheckLocal(mr.lkey, &pd, 0x1000 + 50, ~uint64_t{0} - 10, 0).error, AccessError::kOutOfBounds);
}

TEST(KeyTable, StaleKeyOfDeregisteredRegionDoesNotAliasItsSuccessor) {
  ProtectionDomain pd(1);
  uint8_t buf[16];
  KeyTable keys;
  MemoryRegion a = keys.Register({&pd, buf, 0, sizeof buf, 0});
  ASSERT_TRUE(keys.Deregister(a.lkey));
  EXPECT_FALSE(keys.Deregister(a.lkey));
  MemoryRegion b = keys.Register({&pd, buf, 0, sizeof buf, 0});
  EXPECT_NE(a.lkey, b.lkey);
  EXPECT_EQ(keys.Find(a.lkey), nullptr);
  EXPECT_NE(keys.Find(b.lkey), nullptr);
}

}  // namespace
TEST(KeyTable, FindByHandleIgnoresTheKeyByte) {
  ProtectionDomain pd(1);
  uint8_t buf[16];
  KeyTable keys;
  MemoryRegion a = keys.Register({&pd, buf, 0, sizeof buf, 0});
  const MemoryRegion* found = keys.FindByHandle(a.lkey >> 8);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->lkey, a.lkey);
  ASSERT_TRUE(keys.Deregister(a.lkey));
  EXPECT_EQ(keys.FindByHandle(a.lkey >> 8), nullptr);
}

TEST(KeyTable, AProcessOfTheHostDeviceHandsOutKeysOfItsOwnOnlyUntilTheyAreAllTaken) {
  // Owner 3's keys are (3 << 16 | n) << 8 | key byte: no other process of the host has them, so one imported from
  // another process (Adopt) never meets one of ours.
  ProtectionDomain pd(1);
  uint8_t buf[16];
  KeyTable keys(/*seed=*/0x1234'5678'9abcull, /*owner=*/3);
  MemoryRegion first = keys.Register({&pd, buf, 0, sizeof buf, 0});
  EXPECT_EQ(first.lkey >> 24, 3u);
  MemoryRegion theirs{&pd, buf, 0, sizeof buf, 0};
  theirs.lkey = theirs.rkey = (((4u << 16) | 7u) << 8) | 0x55;
  EXPECT_EQ(keys.Adopt(theirs), 0);
  EXPECT_EQ(keys.Find(theirs.lkey), keys.FindByHandle(theirs.lkey >> 8));
  EXPECT_EQ(keys.Adopt(theirs), EEXIST);
  const uint32_t window = keys.AllocateWindow(&pd, 1);
  EXPECT_EQ(window >> 24, 3u);
  // 0xffff keys in all (regions, windows, and the adopted one counts too); then none is given out.
  size_t made = keys.size() + 1;  // + the window
  for (; made < 0xffff; ++made) ASSERT_EQ(keys.Register({&pd, buf, 0, sizeof buf, 0}).lkey >> 24, 3u);
  EXPECT_EQ(keys.Register({&pd, buf, 0, sizeof buf, 0}).lkey, 0u);
  EXPECT_EQ(keys.AllocateWindow(&pd, 1), 0u);
  ASSERT_TRUE(keys.Deregister(first.lkey));
  const MemoryRegion again = keys.Register({&pd, buf, 0, sizeof buf, 0});
  EXPECT_NE(again.lkey, 0u);
  EXPECT_EQ(again.lkey >> 24, 3u);
}

}  // namespace uroce::emu
