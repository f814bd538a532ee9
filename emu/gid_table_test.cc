#include "emu/gid_table.h"

#include <gtest/gtest.h>

namespace uroce::emu {
namespace {

wire::IpAddress A(uint32_t v4) { return wire::IpAddress::V4(v4); }

TEST(GidTable, EntryZeroIsTheDeviceAddressAndTheRestFollowTheHost) {
  GidTable t(A(0x0a000001));
  EXPECT_EQ(t.At(0), A(0x0a000001));
  EXPECT_EQ(t.At(1), std::nullopt);
  EXPECT_EQ(t.At(GidTable::kEntries), std::nullopt);
  // The host's addresses, entry 0's among them: the others take entries 1, 2, ...
  const wire::IpAddress host[] = {A(0x0a000001), A(0x0a000101), A(0x0a000201)};
  EXPECT_TRUE(t.Update(host));
  EXPECT_EQ(t.At(1), A(0x0a000101));
  EXPECT_EQ(t.At(2), A(0x0a000201));
  EXPECT_EQ(t.IndexOf(A(0x0a000201)), 2u);
  EXPECT_EQ(t.IndexOf(A(0x0a000301)), std::nullopt);
  EXPECT_FALSE(t.Update(host));  // nothing changed
  // One goes: its entry empties and the other keeps its index; one comes: it takes the empty entry.
  const wire::IpAddress after_removal[] = {A(0x0a000201)};
  EXPECT_TRUE(t.Update(after_removal));
  EXPECT_EQ(t.At(1), std::nullopt);
  EXPECT_EQ(t.At(2), A(0x0a000201));
  const wire::IpAddress after_addition[] = {A(0x0a000201), A(0x0a000301)};
  EXPECT_TRUE(t.Update(after_addition));
  EXPECT_EQ(t.At(1), A(0x0a000301));
  EXPECT_EQ(t.At(2), A(0x0a000201));
  EXPECT_EQ(t.Populated().size(), 3u);
  // Entry 0 never moves, even when the host loses its address.
  EXPECT_TRUE(t.Update({}));
  EXPECT_EQ(t.At(0), A(0x0a000001));
  EXPECT_EQ(t.Populated().size(), 1u);
}

TEST(GidTable, WhatDoesNotFitStaysOut) {
  GidTable t(A(0x0a000001));
  std::vector<wire::IpAddress> many;
  for (uint32_t i = 0; i < 40; ++i) many.push_back(A(0x0b000000 + i));
  EXPECT_TRUE(t.Update(many));
  EXPECT_EQ(t.Populated().size(), GidTable::kEntries);
  EXPECT_EQ(t.At(GidTable::kEntries - 1), A(0x0b000000 + GidTable::kEntries - 2));
}

// A process's table takes the host's (the service's) as it is, gaps included; entry 0 stays its own.
TEST(GidTable, AssignTakesAnotherTablesEntriesAsTheyAre) {
  GidTable service(A(0x0a000001)), process(A(0x0a000001));
  const wire::IpAddress host[] = {A(0x0a000101), A(0x0a000201)};
  service.Update(host);
  const wire::IpAddress later[] = {A(0x0a000201)};
  service.Update(later);  // entry 1 empty, entry 2 kept
  EXPECT_TRUE(process.Assign(service.Entries()));
  EXPECT_EQ(process.At(1), std::nullopt);
  EXPECT_EQ(process.At(2), A(0x0a000201));
  EXPECT_FALSE(process.Assign(service.Entries()));
  auto other = service.Entries();
  other[0] = A(0x0c000001);
  EXPECT_FALSE(process.Assign(other));
  EXPECT_EQ(process.At(0), A(0x0a000001));
}

}  // namespace
}  // namespace uroce::emu
