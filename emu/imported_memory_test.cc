// Regions imported from another process (Device::ImportMr, ForeignMemory): every way the HCA touches registered
// memory -- a SEND's gather (one packet and several), a receive's scatter, a remote WRITE, the responses to a READ --
// reaches their bytes only through the region's ForeignMemory, at that process's addresses; an atomic on one is
// refused (it would not be atomic against that process's CPU); when the copy fails (the region gone there) the access
// fails as one outside a valid region; the keys stay the ones that process gave it.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "emu/test_fabric.h"

namespace uroce::emu {
namespace {

using testing::Buffer;
using testing::Drain;
using testing::RcPair;

constexpr uint32_t kAll = access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead | access::kRemoteAtomic;
// Where the other process's bytes live there: never an address of ours.
constexpr uint64_t kThere = 0x7f00'1234'0000;

// Another process's memory, held here in a vector at address `base` there.
class FakeProcessMemory final : public ForeignMemory {
 public:
  explicit FakeProcessMemory(size_t bytes) : bytes(bytes) {
    for (size_t i = 0; i < bytes; ++i) this->bytes[i] = uint8_t(i * 7 + 3);
  }
  bool Read(uint64_t there, void* into, size_t n) override {
    ++reads;
    if (gone || there < base || there - base + n > bytes.size()) return false;
    std::memcpy(into, bytes.data() + (there - base), n);
    return true;
  }
  bool Write(uint64_t there, const void* from, size_t n) override {
    ++writes;
    if (gone || there < base || there - base + n > bytes.size()) return false;
    std::memcpy(bytes.data() + (there - base), from, n);
    return true;
  }
  std::vector<uint8_t> bytes;
  uint64_t base = kThere;
  bool gone = false;  // the region deregistered there, or its process gone
  int reads = 0, writes = 0;
};

// The keys that process gave its region: an index no device of the fabric hands out.
constexpr uint32_t kTheirKey = (0x4205u << 8) | 0x99;
constexpr uint64_t kIova = 0x10000;

struct Imported : RcPair {
  // `mapped_here`: the region's address there is one this process maps too (the fake's own bytes), so that an access
  // that did not go through ForeignMemory would show.
  explicit Imported(bool mapped_here = false, size_t bytes = 16384)
      : RcPair(Mtu::k1024), memory(std::make_shared<FakeProcessMemory>(bytes)) {
    if (mapped_here) memory->base = reinterpret_cast<uint64_t>(memory->bytes.data());
    MemoryRegion theirs;
    theirs.host = reinterpret_cast<uint8_t*>(memory->base);
    theirs.iova = kIova;
    theirs.length = bytes;
    theirs.access = kAll;
    theirs.lkey = theirs.rkey = kTheirKey;
    theirs.foreign = memory;
    // Imported into b's PD: b's QP uses it locally, a's names it remotely.
    EXPECT_EQ(b->device->ImportMr(pb, theirs), 0);
  }
  Sge At(uint64_t offset, uint32_t length) const { return {kIova + offset, length, kTheirKey}; }
  std::shared_ptr<FakeProcessMemory> memory;
};

SendWr Wr(uint64_t id, SendOpcode op, std::vector<Sge> sges, uint64_t remote_addr = 0, uint32_t rkey = 0) {
  SendWr wr;
  wr.wr_id = id;
  wr.opcode = op;
  wr.flags = send_flags::kSignaled;
  wr.sg_list = std::move(sges);
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  return wr;
}

std::vector<uint8_t> Slice(const std::vector<uint8_t>& v, size_t at, size_t n) {
  return {v.begin() + at, v.begin() + at + n};
}

TEST(ImportedMemory, SendsGatherTheOtherProcessesBytesInOnePacketAndInSeveral) {
  Imported t;
  Buffer dst = testing::Register(*t.a->device, t.pa, 8192, kAll);
  for (uint32_t length : {100u, 5000u}) {  // one packet; five at MTU 1024 (gathered packet by packet)
    ASSERT_EQ(t.a->device->PostRecv(t.qa, RecvWr{1, {dst.At(0, 8192)}}), 0);
    ASSERT_EQ(t.b->device->PostSend(t.qb, Wr(2, SendOpcode::kSend, {t.At(1000, length)})), 0);
    t.fabric.Pump();
    auto s = Drain(t.sb);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, WcStatus::kSuccess);
    auto r = Drain(t.ra);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].status, WcStatus::kSuccess);
    EXPECT_EQ(r[0].byte_len, length);
    EXPECT_EQ(Slice(dst.bytes, 0, length), Slice(t.memory->bytes, 1000, length));
  }
  EXPECT_GT(t.memory->reads, 0);
}

TEST(ImportedMemory, ReceivesScatterIntoTheOtherProcessesMemory) {
  Imported t;
  Buffer src = testing::Register(*t.a->device, t.pa, 8192, kAll);
  for (size_t i = 0; i < src.bytes.size(); ++i) src.bytes[i] = uint8_t(i ^ 0x5a);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{1, {t.At(64, 3000), t.At(8000, 3000)}}), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(2, SendOpcode::kSend, {src.At(0, 4500)})), 0);
  t.fabric.Pump();
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, WcStatus::kSuccess);
  EXPECT_EQ(Slice(t.memory->bytes, 64, 3000), Slice(src.bytes, 0, 3000));
  EXPECT_EQ(Slice(t.memory->bytes, 8000, 1500), Slice(src.bytes, 3000, 1500));
}

TEST(ImportedMemory, RemoteWritesLandAndReadsAnswerFromTheOtherProcessesMemory) {
  Imported t;
  Buffer local = testing::Register(*t.a->device, t.pa, 8192, kAll);
  for (size_t i = 0; i < local.bytes.size(); ++i) local.bytes[i] = uint8_t(i * 13);
  // A WRITE of 3 packets through the imported region's rkey, then a READ of 4 packets of it.
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kRdmaWrite, {local.At(0, 3000)}, kIova + 200, kTheirKey)),
            0);
  t.fabric.Pump();
  auto w = Drain(t.sa);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].status, WcStatus::kSuccess);
  EXPECT_EQ(Slice(t.memory->bytes, 200, 3000), Slice(local.bytes, 0, 3000));
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(2, SendOpcode::kRdmaRead, {local.At(4096, 4000)}, kIova + 9000, kTheirKey)),
            0);
  t.fabric.Pump();
  auto rd = Drain(t.sa);
  ASSERT_EQ(rd.size(), 1u);
  EXPECT_EQ(rd[0].status, WcStatus::kSuccess);
  EXPECT_EQ(Slice(local.bytes, 4096, 4000), Slice(t.memory->bytes, 9000, 4000));
}

TEST(ImportedMemory, AnAtomicOnTheOtherProcessesMemoryIsARemoteAccessError) {
  Imported t(/*mapped_here=*/true);
  Buffer local = testing::Register(*t.a->device, t.pa, 64, kAll);
  const std::vector<uint8_t> before = t.memory->bytes;
  SendWr wr = Wr(1, SendOpcode::kAtomicFetchAndAdd, {local.At(0, 8)}, kIova + 64, kTheirKey);
  wr.compare_add = 5;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, WcStatus::kRemAccessErr);
  EXPECT_EQ(t.memory->bytes, before);
}

TEST(ImportedMemory, WhenTheOtherProcessesRegionIsGoneAccessesFailAsOutsideAValidRegion) {
  {
    Imported t;
    t.memory->gone = true;
    ASSERT_EQ(t.b->device->PostSend(t.qb, Wr(1, SendOpcode::kSend, {t.At(0, 100)})), 0);
    t.fabric.Pump();
    auto s = Drain(t.sb);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, WcStatus::kLocProtErr);
  }
  {
    Imported t;
    t.memory->gone = true;
    Buffer local = testing::Register(*t.a->device, t.pa, 4096, kAll);
    ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kRdmaWrite, {local.At(0, 2000)}, kIova, kTheirKey)), 0);
    t.fabric.Pump();
    auto s = Drain(t.sa);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, WcStatus::kRemAccessErr);
  }
}

TEST(ImportedMemory, KeepsItsKeysCannotBeImportedTwiceOrChangedHereAndDeregistersAsAnyRegion) {
  Imported t;
  MemoryRegion q;
  ASSERT_EQ(t.b->device->QueryMr(kTheirKey, &q), 0);
  EXPECT_EQ(q.rkey, kTheirKey);
  EXPECT_EQ(q.pd, t.pb);
  MemoryRegion again;
  again.host = reinterpret_cast<uint8_t*>(kThere);
  again.length = 64;
  again.lkey = again.rkey = kTheirKey;
  again.foreign = t.memory;
  EXPECT_EQ(t.b->device->ImportMr(t.pb, again), EEXIST);
  again.foreign = nullptr;
  again.lkey = again.rkey = kTheirKey + 0x100;
  EXPECT_EQ(t.b->device->ImportMr(t.pb, again), EINVAL);  // no way to its memory
  MemoryRegion out;
  EXPECT_EQ(t.b->device->ReregisterMr(kTheirKey, t.pb, nullptr, 64, 0, kAll, &out), EOPNOTSUPP);
  ASSERT_EQ(t.b->device->DeregisterMr(kTheirKey), 0);
  EXPECT_EQ(t.b->device->QueryMr(kTheirKey, &q), EINVAL);
  const int reads = t.memory->reads;
  ASSERT_EQ(t.b->device->PostSend(t.qb, Wr(1, SendOpcode::kSend, {t.At(0, 100)})), 0);
  t.fabric.Pump();
  auto s = Drain(t.sb);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, WcStatus::kLocProtErr);
  EXPECT_EQ(t.memory->reads, reads);  // nothing read through a deregistered key
}

}  // namespace
}  // namespace uroce::emu
