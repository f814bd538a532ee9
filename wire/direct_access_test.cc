#include "wire/direct_access.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace uroce::wire {
namespace {

constexpr uint32_t kQpn = 0x030011, kPeerQpn = 0x040022, kPd = 7, kRkey = 0x1234517;

class DirectTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(DirectTable::Create(&owner_, &fd_), 0);
    ASSERT_EQ(DirectTable::Attach(fd_, &peer_), 0);
    ASSERT_TRUE(owner_->PublishQp({kQpn, kPeerQpn, kPd, direct_rights::kWrite | direct_rights::kRead}));
    ASSERT_TRUE(owner_->PublishRegion({kRkey, kPd, direct_rights::kWrite, 0x10000, sizeof buffer_, buffer_}));
  }
  void TearDown() override { close(fd_); }

  uint64_t Check(uint32_t dest, uint32_t src, uint32_t rkey, uint64_t va, uint64_t len, uint32_t right) {
    peer_->Enter(4, getpid());
    const uint64_t host = peer_->Check(dest, src, rkey, va, len, right);
    peer_->Leave(4);
    return host;
  }

  uint8_t buffer_[256] = {};
  int fd_ = -1;
  std::unique_ptr<DirectTable> owner_, peer_;
};

TEST_F(DirectTableTest, AnotherMappingSeesTheOwnersPid) { EXPECT_EQ(peer_->pid(), getpid()); }

TEST_F(DirectTableTest, AllowsWhatTheResponderWouldExecute) {
  EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey, 0x10000, 256, direct_rights::kWrite), reinterpret_cast<uint64_t>(buffer_));
  EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey, 0x10010, 16, direct_rights::kWrite),
            reinterpret_cast<uint64_t>(buffer_ + 0x10));
}

TEST_F(DirectTableTest, RefusesEveryCheckTheResponderMakes) {
  // Not the QP's peer; an unknown QP; an unknown R_Key.
  EXPECT_EQ(Check(kQpn, kPeerQpn + 1, kRkey, 0x10000, 8, direct_rights::kWrite), 0u);
  EXPECT_EQ(Check(kQpn + 1, kPeerQpn, kRkey, 0x10000, 8, direct_rights::kWrite), 0u);
  EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey + 0x100, 0x10000, 8, direct_rights::kWrite), 0u);
  // Bounds: before, past the end, a length that wraps.
  EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey, 0xffff, 8, direct_rights::kWrite), 0u);
  EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey, 0x10000, 257, direct_rights::kWrite), 0u);
  EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey, 0x100f9, 8, direct_rights::kWrite), 0u);
  EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey, 0x10008, ~uint64_t{0}, direct_rights::kWrite), 0u);
  // The region grants no remote read.
  EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey, 0x10000, 8, direct_rights::kRead), 0u);
  // A region of another PD than the QP's.
  ASSERT_TRUE(owner_->PublishRegion({kRkey + 0x100, kPd + 1, direct_rights::kWrite, 0, 64, buffer_}));
  EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey + 0x100, 0, 8, direct_rights::kWrite), 0u);
  // A QP whose access flags allow no remote write.
  ASSERT_TRUE(owner_->PublishQp({kQpn, kPeerQpn, kPd, direct_rights::kRead}));
  EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey, 0x10000, 8, direct_rights::kWrite), 0u);
}

TEST_F(DirectTableTest, WithdrawnEntriesAllowNothing) {
  owner_->WithdrawRegion(kRkey);
  EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey, 0x10000, 8, direct_rights::kWrite), 0u);
  ASSERT_TRUE(owner_->PublishRegion({kRkey, kPd, direct_rights::kWrite, 0x10000, sizeof buffer_, buffer_}));
  owner_->WithdrawQp(kQpn);
  EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey, 0x10000, 8, direct_rights::kWrite), 0u);
  owner_->WithdrawQp(kQpn);  // twice: nothing
}

TEST_F(DirectTableTest, ManyEntriesEachFoundByItsOwnKey) {
  for (uint32_t i = 1; i <= 1000; ++i) {
    ASSERT_TRUE(owner_->PublishRegion({kRkey + (i << 8), kPd, direct_rights::kWrite, i << 12, 64, buffer_}));
  }
  for (uint32_t i = 1; i <= 1000; ++i) {
    EXPECT_EQ(Check(kQpn, kPeerQpn, kRkey + (i << 8), (i << 12) + 8, 8, direct_rights::kWrite),
              reinterpret_cast<uint64_t>(buffer_ + 8))
        << i;
  }
}

TEST_F(DirectTableTest, AWithdrawalWaitsForACopyInProgress) {
  peer_->Enter(9, getpid());
  ASSERT_NE(peer_->Check(kQpn, kPeerQpn, kRkey, 0x10000, 8, direct_rights::kWrite), 0u);
  std::atomic<bool> withdrawn{false};
  std::thread owner([&] {
    owner_->WithdrawRegion(kRkey);
    withdrawn = true;
  });
  // The copy has not left: the withdrawal must still be waiting after a while (it cannot return before Leave).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(withdrawn.load());
  peer_->Leave(9);
  owner.join();
  EXPECT_TRUE(withdrawn.load());
}

TEST_F(DirectTableTest, AWithdrawalDoesNotWaitForAnInitiatorThatDied) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    peer_->Enter(11, getpid());  // and dies inside its copy
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  auto withdrawal = std::async(std::launch::async, [&] { owner_->WithdrawRegion(kRkey); });
  EXPECT_EQ(withdrawal.wait_for(std::chrono::seconds(20)), std::future_status::ready);
}

TEST_F(DirectTableTest, AnOfferIsTakenOnceAndWithdrawnOnlyBeforeItIsTaken) {
  using Offer = DirectTable::Offer;
  const uint64_t host = reinterpret_cast<uint64_t>(buffer_);
  peer_->Enter(5, getpid());
  ASSERT_TRUE(peer_->OfferCopy(5, kRkey, 0xabc000, host + 16, 32));
  EXPECT_FALSE(peer_->OfferCopy(5, kRkey, 0xabc000, host + 16, 32));  // one offer of a number at a time
  EXPECT_EQ(peer_->OfferOf(5), Offer::kOffered);
  uint64_t src = 0, there = 0, length = 0;
  EXPECT_FALSE(owner_->TakeOffer(6, &src, &there, &length));  // another number offered nothing
  ASSERT_TRUE(owner_->TakeOffer(5, &src, &there, &length));
  EXPECT_EQ(src, 0xabc000u);
  EXPECT_EQ(there, host + 16);
  EXPECT_EQ(length, 32u);
  EXPECT_FALSE(owner_->TakeOffer(5, &src, &there, &length));  // a second notice of it finds it taken
  EXPECT_FALSE(peer_->WithdrawOffer(5));                     // taken: the initiator waits for the copy
  EXPECT_EQ(peer_->OfferOf(5), Offer::kTaken);
  owner_->FinishOffer(5, true);
  EXPECT_EQ(peer_->OfferOf(5), Offer::kCopied);
  peer_->ClearOffer(5);
  // Withdrawn before the owner looked: it never takes it.
  ASSERT_TRUE(peer_->OfferCopy(5, kRkey, 0xabc000, host, 256));
  EXPECT_TRUE(peer_->WithdrawOffer(5));
  EXPECT_FALSE(owner_->TakeOffer(5, &src, &there, &length));
  EXPECT_EQ(peer_->OfferOf(5), Offer::kNone);
  peer_->Leave(5);
}

TEST_F(DirectTableTest, TheOwnerRefusesAnOfferOutsideARegionItsPeersMayWrite) {
  using Offer = DirectTable::Offer;
  const uint64_t host = reinterpret_cast<uint64_t>(buffer_);
  uint8_t readable[64] = {};
  ASSERT_TRUE(owner_->PublishRegion({kRkey + 0x100, kPd, direct_rights::kRead, 0, sizeof readable, readable}));
  struct Case {
    uint32_t rkey;
    uint64_t there, length;
  } refused[] = {
      {kRkey, host + 250, 16},                                       // past the region's end
      {kRkey, host - 8, 16},                                         // before its start
      {kRkey, host + 8, ~uint64_t{0}},                               // a length that wraps
      {kRkey, host, 0},                                              // nothing
      {kRkey + 0x200, host, 16},                                     // no such R_Key
      {kRkey + 0x100, reinterpret_cast<uint64_t>(readable), 16},     // a region peers may only read
  };
  for (const Case& c : refused) {
    ASSERT_TRUE(peer_->OfferCopy(5, c.rkey, 0xabc000, c.there, c.length));
    uint64_t src = 0, there = 0, length = 0;
    EXPECT_FALSE(owner_->TakeOffer(5, &src, &there, &length)) << c.there - host << " " << c.length;
    EXPECT_EQ(peer_->OfferOf(5), Offer::kFailed);
    peer_->ClearOffer(5);
  }
}

TEST_F(DirectTableTest, ANewProcessOnAnOwnerNumberFindsNoOfferItsPredecessorLeft) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    peer_->Enter(12, getpid());
    const bool offered = peer_->OfferCopy(12, kRkey, 0xabc000, reinterpret_cast<uint64_t>(buffer_), 16);
    _exit(offered ? 0 : 1);  // and dies waiting for it
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(peer_->OfferOf(12), DirectTable::Offer::kOffered);
  peer_->Enter(12, getpid());
  EXPECT_EQ(peer_->OfferOf(12), DirectTable::Offer::kNone);
  EXPECT_TRUE(peer_->OfferCopy(12, kRkey, 0xabc000, reinterpret_cast<uint64_t>(buffer_), 16));
  peer_->Leave(12);
}

TEST(CopyOfferRecord, EncodesAndDecodesItsOwner) {
  uint8_t bytes[CopyOffer::kSize];
  CopyOffer{77}.Encode(bytes);
  const auto back = CopyOffer::Decode(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->owner, 77);
  EXPECT_FALSE(CopyOffer::Decode(std::span<const uint8_t>(bytes, CopyOffer::kSize - 1)));
  bytes[0] = 'S';
  EXPECT_FALSE(CopyOffer::Decode(bytes));
}

TEST_F(DirectTableTest, RefusesAFileThatIsNotATable) {
  const int f = memfd_create("not-a-table", MFD_CLOEXEC);
  ASSERT_GE(f, 0);
  std::unique_ptr<DirectTable> t;
  EXPECT_EQ(DirectTable::Attach(f, &t), -EINVAL);  // not sealed
  close(f);
}

// --- direct SENDs: the receive window -----------------------------------------------------------------------------

class ReceiveWindowTest : public DirectTableTest {
 protected:
  void SetUp() override {
    DirectTableTest::SetUp();
    ASSERT_TRUE(owner_->PublishQp({kQpn, kPeerQpn, kPd, direct_rights::kSend}));
    ASSERT_TRUE(owner_->OpenReceives(kQpn, 5));
  }
  // The initiator's claim of a SEND of `length` bytes: the WQE index, or -1 when it must go as packets.
  int64_t Claim(uint64_t length, uint32_t src = kPeerQpn, bool count = true) {
    DirectSend send;
    send.dest_qpn = kQpn;
    send.src_qpn = src;
    uint32_t slot = 0;
    peer_->Enter(4, getpid());
    const bool ok = peer_->ClaimReceive(&send, length, &slot);
    if (ok && count) peer_->CountSend(slot);
    peer_->Leave(4);
    if (ok) EXPECT_EQ(send.epoch, epoch_);
    return ok ? int64_t(send.index) : -1;
  }
  uint32_t epoch_ = 5;
};

TEST_F(ReceiveWindowTest, ASendTakesTheNextShownWqeWhenItIsLongEnough) {
  EXPECT_EQ(Claim(1), -1);  // nothing posted
  const uint32_t lengths[] = {64, 16, 4096};
  owner_->PublishReceives(kQpn, 0, 0, lengths);
  EXPECT_EQ(Claim(65), -1);  // longer than WQE 0: the responder's error, by packets
  EXPECT_EQ(Claim(64), 0);
  EXPECT_EQ(Claim(16), 1);
  EXPECT_EQ(Claim(0), 2);
  EXPECT_EQ(Claim(1), -1);  // all three claimed
  EXPECT_EQ(owner_->DirectSends(kQpn), 3u);
}

TEST_F(ReceiveWindowTest, OnlyTheQpsPeerMaySendAndOnlyIntoAQpThatReceivesDirectly) {
  const uint32_t lengths[] = {64};
  owner_->PublishReceives(kQpn, 0, 0, lengths);
  EXPECT_EQ(Claim(8, kPeerQpn + 1), -1);
  ASSERT_TRUE(owner_->PublishQp({kQpn, kPeerQpn, kPd, direct_rights::kWrite}));  // on an SRQ: no kSend
  EXPECT_EQ(Claim(8), -1);
  ASSERT_TRUE(owner_->PublishQp({kQpn, kPeerQpn, kPd, direct_rights::kSend}));
  EXPECT_EQ(Claim(8), 0);
  owner_->WithdrawQp(kQpn);  // the error state
  EXPECT_EQ(Claim(8), -1);
  EXPECT_EQ(owner_->DirectSends(kQpn), 1u);  // the window stays, with its count
}

TEST_F(ReceiveWindowTest, WqesTakenByPacketsMoveTheNextIndexOn) {
  const uint32_t lengths[] = {8, 8, 8, 8};
  owner_->PublishReceives(kQpn, 0, 0, lengths);
  EXPECT_EQ(Claim(8), 0);
  // WQE 1 went to a message that came as packets (the initiator's, before it sent again).
  owner_->PublishReceives(kQpn, 1, 4, {});
  EXPECT_EQ(Claim(8), 2);
}

TEST_F(ReceiveWindowTest, TheWindowShowsWhatTheOwnerPublishedAsItWraps) {
  for (uint32_t i = 0; i < 3 * kReceiveWindow; ++i) {
    const uint32_t length = 100 + i;
    owner_->PublishReceives(kQpn, 0, i, {&length, 1});
    EXPECT_EQ(Claim(length + 1), -1) << i;
    EXPECT_EQ(Claim(length), int64_t(i)) << i;
  }
}

TEST_F(ReceiveWindowTest, ReopeningStartsANewIncarnationAndClosingEndsIt) {
  const uint32_t lengths[] = {8, 8};
  owner_->PublishReceives(kQpn, 0, 0, lengths);
  EXPECT_EQ(Claim(8), 0);
  ASSERT_TRUE(owner_->OpenReceives(kQpn, 6));  // RESET and back: counts from 0 again
  epoch_ = 6;
  EXPECT_EQ(owner_->DirectSends(kQpn), 0u);
  EXPECT_EQ(Claim(8), -1);
  owner_->PublishReceives(kQpn, 0, 0, lengths);
  EXPECT_EQ(Claim(8), 0);
  owner_->CloseReceives(kQpn);
  EXPECT_EQ(Claim(8), -1);
  EXPECT_EQ(owner_->DirectSends(kQpn), 0u);
}

TEST(DirectSendRecord, EncodesAndDecodesEveryField) {
  DirectSend d;
  d.dest_qpn = 0x030011;
  d.src_qpn = 0x040022;
  d.epoch = 77;
  d.index = (uint64_t{1} << 40) + 3;
  d.imm = 0xdeadbeef;
  d.with_imm = true;
  d.solicited = true;
  uint8_t bytes[DirectSend::kSize + 4];
  d.Encode(bytes);
  const auto back = DirectSend::Decode(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->dest_qpn, d.dest_qpn);
  EXPECT_EQ(back->src_qpn, d.src_qpn);
  EXPECT_EQ(back->epoch, d.epoch);
  EXPECT_EQ(back->index, d.index);
  EXPECT_EQ(back->imm, d.imm);
  EXPECT_TRUE(back->with_imm && back->solicited);
  EXPECT_FALSE(DirectSend::Decode(std::span<const uint8_t>(bytes, DirectSend::kSize - 1)));
  bytes[0] = 'X';
  EXPECT_FALSE(DirectSend::Decode(bytes));
}

// --- XRC SRQs shared by the host's processes ------------------------------------------------------------------------

TEST_F(DirectTableTest, ExportedPdsAndRegionsAreFoundByHandleWhileExported) {
  EXPECT_FALSE(peer_->HasPd(3));
  ASSERT_TRUE(owner_->ExportPd(3));
  ASSERT_TRUE(owner_->ExportPd(4));
  EXPECT_TRUE(peer_->HasPd(3));
  EXPECT_TRUE(peer_->HasPd(4));
  EXPECT_FALSE(peer_->HasPd(5));
  owner_->WithdrawPd(3);
  EXPECT_FALSE(peer_->HasPd(3));
  EXPECT_TRUE(peer_->HasPd(4));
  // A region is found by its handle (the key's index), whatever its key byte; a local-only one (access without remote
  // rights) too: an importer may use it locally.
  const uint32_t lkey = (0x030007u << 8) | 0x5c;
  ASSERT_TRUE(owner_->ExportRegion({lkey, 4, /*access=*/1, 0x10000, 8192, 0x7f0000001000}));
  ExportedRegion r;
  ASSERT_TRUE(peer_->FindExportedRegion(lkey >> 8, &r));
  EXPECT_EQ(r.lkey, lkey);
  EXPECT_EQ(r.pd, 4u);
  EXPECT_EQ(r.access, 1u);
  EXPECT_EQ(r.iova, 0x10000u);
  EXPECT_EQ(r.length, 8192u);
  EXPECT_EQ(r.host, 0x7f0000001000u);
  EXPECT_FALSE(peer_->FindExportedRegion((lkey >> 8) + 1, &r));
  // Within it, at its process's addresses; not past its end, not under another key byte.
  EXPECT_TRUE(peer_->Exported(lkey, 0x7f0000001000, 8192));
  EXPECT_TRUE(peer_->Exported(lkey, 0x7f0000002000, 4096));
  EXPECT_FALSE(peer_->Exported(lkey, 0x7f0000002000, 4097));
  EXPECT_FALSE(peer_->Exported(lkey, 0x7f0000000fff, 2));
  EXPECT_FALSE(peer_->Exported(lkey ^ 1, 0x7f0000001000, 8));
  // The direct-access check does not grant through an exported region: it was not published for remote access.
  EXPECT_EQ(peer_->Check(kQpn, kPeerQpn, lkey, 0x10000, 8, direct_rights::kWrite), 0u);
  owner_->WithdrawExportedRegion(lkey);
  EXPECT_FALSE(peer_->FindExportedRegion(lkey >> 8, &r));
  EXPECT_FALSE(peer_->Exported(lkey, 0x7f0000001000, 8));
}

TEST_F(DirectTableTest, WithdrawingAnExportedRegionWaitsForAnImportersCopy) {
  const uint32_t lkey = (0x030008u << 8) | 0x11;
  ASSERT_TRUE(owner_->ExportRegion({lkey, 4, 1, 0, 4096, 0x7f0000001000}));
  peer_->Enter(9, getpid());
  ASSERT_TRUE(peer_->Exported(lkey, 0x7f0000001000, 8));
  auto withdrawal = std::async(std::launch::async, [&] { owner_->WithdrawExportedRegion(lkey); });
  // It cannot return before Leave: still waiting after a while.
  EXPECT_EQ(withdrawal.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  peer_->Leave(9);
  EXPECT_EQ(withdrawal.wait_for(std::chrono::seconds(20)), std::future_status::ready);
}

TEST_F(DirectTableTest, AnXrcSrqIsFoundOnlyForItsDomainAndWhilePublished) {
  constexpr uint32_t kSrqn = 0x030001;
  EXPECT_FALSE(peer_->SrqInDomain(kSrqn, 77));
  ASSERT_TRUE(owner_->PublishSrq(kSrqn, 77));
  EXPECT_TRUE(peer_->SrqInDomain(kSrqn, 77));
  EXPECT_FALSE(peer_->SrqInDomain(kSrqn, 78));
  EXPECT_FALSE(peer_->SrqInDomain(kSrqn + 1, 77));
  owner_->WithdrawSrq(kSrqn);
  EXPECT_FALSE(peer_->SrqInDomain(kSrqn, 77));
  uint64_t index = 0;
  uint32_t length = 0;
  EXPECT_FALSE(peer_->ClaimSrqWqe(kSrqn, &index, &length));
}

// Every taker claims, the owner too: the next shown WQE, with its number and length; never one not shown.
TEST_F(DirectTableTest, AClaimIsTheNextShownWqeWithItsLength) {
  constexpr uint32_t kSrqn = 0x030002;
  ASSERT_TRUE(owner_->PublishSrq(kSrqn, 5));
  uint64_t index = 0;
  uint32_t length = 0;
  EXPECT_FALSE(peer_->ClaimSrqWqe(kSrqn, &index, &length));
  const uint32_t lengths[] = {100, 4096};
  owner_->ShowSrqWqes(kSrqn, 0, lengths);
  ASSERT_TRUE(peer_->ClaimSrqWqe(kSrqn, &index, &length));
  EXPECT_EQ(index, 0u);
  EXPECT_EQ(length, 100u);
  ASSERT_TRUE(owner_->ClaimSrqWqe(kSrqn, &index, &length));
  EXPECT_EQ(index, 1u);
  EXPECT_EQ(length, 4096u);
  EXPECT_FALSE(peer_->ClaimSrqWqe(kSrqn, &index, &length));
  EXPECT_EQ(owner_->SrqClaimed(kSrqn), 2u);
  // The window wraps: with two claimed, WQEs up to kSrqWindow + 1 may be shown; WQE kSrqWindow lives where WQE 0 did.
  std::vector<uint32_t> more(kSrqWindow);
  for (size_t i = 0; i < more.size(); ++i) more[i] = uint32_t(1000 + i);
  owner_->ShowSrqWqes(kSrqn, 2, more);
  for (uint64_t want = 2; want < 2 + kSrqWindow; ++want) {
    ASSERT_TRUE(peer_->ClaimSrqWqe(kSrqn, &index, &length));
    EXPECT_EQ(index, want);
    EXPECT_EQ(length, 1000 + (want - 2));
  }
  // Republished (another SRQ of that number): its counts start again.
  ASSERT_TRUE(owner_->PublishSrq(kSrqn, 5));
  EXPECT_EQ(owner_->SrqClaimed(kSrqn), 0u);
  EXPECT_FALSE(peer_->ClaimSrqWqe(kSrqn, &index, &length));
}

// Claimers racing from both mappings get every shown WQE exactly once.
TEST_F(DirectTableTest, ConcurrentClaimersTakeEachShownWqeOnce) {
  constexpr uint32_t kSrqn = 0x030003;
  ASSERT_TRUE(owner_->PublishSrq(kSrqn, 5));
  std::vector<uint32_t> lengths(kSrqWindow);
  for (size_t i = 0; i < lengths.size(); ++i) lengths[i] = uint32_t(i);
  owner_->ShowSrqWqes(kSrqn, 0, lengths);
  std::vector<std::vector<uint64_t>> got(4);
  std::vector<std::thread> claimers;
  for (int t = 0; t < 4; ++t) {
    claimers.emplace_back([&, t] {
      DirectTable& table = t % 2 == 0 ? *owner_ : *peer_;
      uint64_t index = 0;
      uint32_t length = 0;
      while (table.ClaimSrqWqe(kSrqn, &index, &length)) {
        EXPECT_EQ(length, index);
        got[t].push_back(index);
      }
    });
  }
  for (std::thread& t : claimers) t.join();
  std::vector<uint64_t> all;
  for (const auto& g : got) all.insert(all.end(), g.begin(), g.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), size_t{kSrqWindow});
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], i);
}

// XRC target QPs (ibv_open_qp(3) across processes): found for their domain while published; the attributes the
// owner publishes, rewritten at each change; an opener holds the QP until it closes its handle.
TEST_F(DirectTableTest, AnXrcTargetIsOpenedForItsDomainAndHeldUntilClosed) {
  constexpr uint32_t kTarget = 0x030005;
  const uint8_t first[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_TRUE(owner_->PublishTarget(kTarget, 5, first));
  uint8_t read[16] = {};
  ASSERT_TRUE(peer_->ReadTarget(kTarget, read));
  EXPECT_EQ(std::memcmp(read, first, sizeof first), 0);
  EXPECT_EQ(read[sizeof first], 0);  // only what was published
  EXPECT_FALSE(peer_->OpenTarget(kTarget, 6, 4, getpid()));  // another domain
  EXPECT_FALSE(peer_->OpenTarget(kTarget + 1, 5, 4, getpid()));
  EXPECT_TRUE(owner_->ReleaseTarget(kTarget + 1));  // nothing published: nothing to keep
  ASSERT_TRUE(peer_->OpenTarget(kTarget, 5, 4, getpid()));
  const uint8_t second[] = {9, 9};
  ASSERT_TRUE(owner_->PublishTarget(kTarget, 5, second));  // rewritten: the holder stays
  ASSERT_TRUE(peer_->ReadTarget(kTarget, read));
  EXPECT_EQ(read[0], 9);
  EXPECT_FALSE(owner_->ReleaseTarget(kTarget));  // held
  ASSERT_TRUE(peer_->ReadTarget(kTarget, read));  // and still there
  peer_->CloseTarget(kTarget, 4);
  EXPECT_TRUE(owner_->ReleaseTarget(kTarget));
  EXPECT_FALSE(peer_->ReadTarget(kTarget, read));
  EXPECT_FALSE(peer_->OpenTarget(kTarget, 5, 4, getpid()));
  const uint8_t too_long[kTargetAttributeBytes + 1] = {};
  EXPECT_FALSE(owner_->PublishTarget(kTarget, 5, too_long));
}

// A holder whose process is gone holds nothing; withdrawing does not ask.
TEST_F(DirectTableTest, AnXrcTargetsHolderThatIsGoneHoldsNothing) {
  constexpr uint32_t kTarget = 0x030006;
  const uint8_t attributes[8] = {};
  ASSERT_TRUE(owner_->PublishTarget(kTarget, 5, attributes));
  const pid_t gone = fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  ASSERT_TRUE(peer_->OpenTarget(kTarget, 5, 9, gone));
  EXPECT_TRUE(owner_->ReleaseTarget(kTarget));
  ASSERT_TRUE(owner_->PublishTarget(kTarget, 5, attributes));
  ASSERT_TRUE(peer_->OpenTarget(kTarget, 5, 4, getpid()));
  owner_->WithdrawTarget(kTarget);
  uint8_t read[8];
  EXPECT_FALSE(peer_->ReadTarget(kTarget, read));
}

// Whoever reads the table finds a target's holders (and their pids, which a process taking the QP over carries into
// its own table); a publication with holders (the adopter's) starts with them.
TEST_F(DirectTableTest, AnXrcTargetsHoldersAreReadWithTheirPids) {
  constexpr uint32_t kTarget = 0x030008;
  const uint8_t attributes[4] = {4, 3, 2, 1};
  uint64_t holders[4] = {};
  EXPECT_FALSE(peer_->TargetHolders(kTarget, holders));
  ASSERT_TRUE(owner_->PublishTarget(kTarget, 5, attributes));
  ASSERT_TRUE(peer_->OpenTarget(kTarget, 5, 70, getpid()));
  ASSERT_TRUE(peer_->TargetHolders(kTarget, holders));
  EXPECT_EQ(holders[1], uint64_t{1} << (70 - 64));
  EXPECT_EQ(holders[0] | holders[2] | holders[3], 0u);

  EXPECT_EQ(peer_->ProcessOf(70), getpid());

  constexpr uint32_t kAdopted = 0x030009;
  const uint64_t others[4] = {uint64_t{1} << 9, 0, 0, 0};
  ASSERT_TRUE(owner_->PublishTarget(kAdopted, 5, attributes, others));
  EXPECT_TRUE(owner_->ReleaseTarget(kAdopted));  // number 9's process is not known here: it counts as gone
  ASSERT_TRUE(owner_->PublishTarget(kAdopted, 5, attributes, others));
  owner_->NoteProcess(9, getpid());
  EXPECT_FALSE(owner_->ReleaseTarget(kAdopted));  // now it holds it (its pid: ours, alive)
}

// Opening races the owner's release: the opener either holds the QP (the owner kept it) or fails (the owner withdrew
// it), never holds a QP that was withdrawn.
TEST_F(DirectTableTest, AnOpenRacingTheReleaseEitherHoldsOrFails) {
  constexpr uint32_t kTarget = 0x030007;
  const uint8_t attributes[8] = {};
  for (int round = 0; round < 2000; ++round) {
    ASSERT_TRUE(owner_->PublishTarget(kTarget, 5, attributes));
    std::atomic<bool> go{false};
    bool opened = false;
    std::thread opener([&] {
      while (!go.load()) {
      }
      opened = peer_->OpenTarget(kTarget, 5, 4, getpid());
    });
    go.store(true);
    const bool released = owner_->ReleaseTarget(kTarget);
    opener.join();
    ASSERT_FALSE(opened && released) << "round " << round;
    if (opened) {
      peer_->CloseTarget(kTarget, 4);
      ASSERT_TRUE(owner_->ReleaseTarget(kTarget));
    }
  }
}

TEST(XrcTargetEventRecord, EncodesAndDecodesEveryField) {
  uint8_t bytes[XrcTargetEvent::kSize];
  XrcTargetEvent{0x02abcd, 16}.Encode(bytes);
  const auto e = XrcTargetEvent::Decode(bytes);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->qpn, 0x02abcdu);
  EXPECT_EQ(e->event, 16);
  EXPECT_FALSE(XrcTargetEvent::Decode(std::span<const uint8_t>(bytes, XrcTargetEvent::kSize - 1)));
  bytes[0] = 'X';  // another record's marker
  EXPECT_FALSE(XrcTargetEvent::Decode(bytes));
}

TEST(XrcDeliveryRecord, EncodesAndDecodesEveryField) {
  XrcDelivery d;
  d.srqn = 0x050001;
  d.target_qpn = 0x030011;
  d.src_qpn = 0x123456;
  d.imm = 0xdeadbeef;
  d.index = (uint64_t{1} << 33) + 7;
  d.psn = 0xabcdef;
  d.status = 12;
  d.first = d.with_imm = d.abort = true;
  uint8_t bytes[XrcDelivery::kSize];
  d.Encode(bytes);
  auto back = XrcDelivery::Decode(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->srqn, d.srqn);
  EXPECT_EQ(back->target_qpn, d.target_qpn);
  EXPECT_EQ(back->src_qpn, d.src_qpn);
  EXPECT_EQ(back->imm, d.imm);
  EXPECT_EQ(back->index, d.index);
  EXPECT_EQ(back->psn, d.psn);
  EXPECT_EQ(back->status, 12);
  EXPECT_TRUE(back->first && back->with_imm && back->abort);
  EXPECT_FALSE(back->last || back->solicited || back->resent);
  d = XrcDelivery{};
  d.last = d.solicited = d.resent = true;
  d.Encode(bytes);
  back = XrcDelivery::Decode(bytes);
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->last && back->solicited && back->resent);
  EXPECT_FALSE(back->first || back->with_imm || back->abort);
  EXPECT_FALSE(XrcDelivery::Decode(std::span<const uint8_t>(bytes, XrcDelivery::kSize - 1)));
  bytes[0] = 'S';  // a direct SEND's marker
  EXPECT_FALSE(XrcDelivery::Decode(bytes));
}

TEST(CrossMemoryCopy, WritesAndReadsAnotherProcessesMemory) {
  // A child holds a buffer; we write into it and read it back through its pid.
  static uint8_t shared_target[64];
  std::memset(shared_target, 0, sizeof shared_target);
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(2);
    if (read(done[0], &c, 1) != 1) _exit(2);  // until the parent has written and read
    _exit(shared_target[5] == 'b' ? 0 : 1);  // the bytes arrived in the child's own memory
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  const uint8_t first[] = {'a', 'b', 'c'}, second[] = {'d', 'e'};
  const std::span<const uint8_t> pieces[] = {first, second};
  const int w = CopyToProcess(child, reinterpret_cast<uint64_t>(shared_target) + 4, pieces, 5);
  if (w == -EPERM) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    GTEST_SKIP() << "process_vm_writev is refused here (ptrace rules)";
  }
  EXPECT_EQ(w, 1);
  uint8_t back[5] = {};
  const std::span<uint8_t> into[] = {back};
  EXPECT_EQ(CopyFromProcess(child, reinterpret_cast<uint64_t>(shared_target) + 4, into, 5), 1);
  EXPECT_EQ(std::memcmp(back, "abcde", 5), 0);
  // An address the child has not mapped.
  EXPECT_EQ(CopyFromProcess(child, 8, into, 5), -EFAULT);
  ASSERT_EQ(write(done[1], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace uroce::wire
