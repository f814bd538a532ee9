// Soak of the Reliable Connection protocol on a lossy simulated network: tens of thousands of mixed operations in
// both directions of one connection, with seeded loss, duplication, reordering (and corruption, which the ICRC turns
// into loss). Everything is checked against a model: every byte a WRITE or SEND placed and a READ fetched, every
// atomic's original value and final word, every completion exactly once and in post order, and at the end nothing
// left behind. Deterministic: the ManualClock, the seeded FaultModel and a seeded generator decide everything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <random>

#include "emu/test_fabric.h"
#include "wire/fault_model.h"

namespace uroce::emu {
namespace {

using testing::Buffer;
using testing::Drain;
using testing::Node;
using testing::RcAttributes;
using testing::RcPair;

constexpr uint32_t kMrAll = access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead | access::kRemoteAtomic;
constexpr size_t kSlot = 4096;         // largest message; one slot per op in each ring
constexpr size_t kSlots = 64;          // ring size: more than the ops outstanding per direction
constexpr size_t kMaxOutstanding = 48; // posted and not yet known complete, per direction (max_send_wr is 64)
constexpr size_t kRecvDepth = 48;      // receives kept posted at the responder
constexpr size_t kRecvSlots = 64;
constexpr size_t kReadSource = 65536;
constexpr size_t kWords = 4;

struct PostedOp {
  uint64_t seq = 0;
  SendOpcode opcode = SendOpcode::kSend;
  bool signaled = false;
  uint32_t length = 0;
  size_t slot = 0;
  uint64_t remote_off = 0;         // WRITE: into the target ring slot; READ: into the read source
  std::vector<uint8_t> data;       // SEND/WRITE: what was sent
  uint64_t expect_original = 0;    // atomics
};

struct ExpectedReceive {
  WcOpcode opcode = WcOpcode::kRecv;
  std::vector<uint8_t> data;  // SEND: the message
  uint32_t byte_len = 0;
  std::optional<uint32_t> imm;
};

// One direction: requester X (its QP sends requests) and responder Y (its QP answers them). Both directions share one
// connection, so each QP is requester for one direction and responder for the other.
struct Direction {
  Node* x = nullptr;
  Node* y = nullptr;
  QueuePair* qx = nullptr;
  QueuePair* qy = nullptr;
  CompletionQueue* send_cq_x = nullptr;
  CompletionQueue* recv_cq_y = nullptr;
  Buffer src, landing;                      // at X
  Buffer target, read_source, words, recv;  // at Y
  std::vector<uint8_t> target_model, read_source_model;
  uint64_t word_model[kWords] = {};

  std::deque<PostedOp> posted;  // not yet known complete, in post order
  std::deque<ExpectedReceive> expected_receives;
  uint64_t next_seq = 1;
  uint64_t next_recv_id = 0;   // wr_id of the next receive Y posts
  uint64_t next_recv_done = 0; // wr_id of the next receive completion expected at Y
  size_t receives_free = 0;    // posted at Y and not claimed by a message X has posted
  uint64_t ops_posted = 0, ops_confirmed = 0, receives_completed = 0;
  uint64_t per_opcode[16] = {};
};

void InitDirection(Direction& d, Node* x, Node* y, ProtectionDomain* px, ProtectionDomain* py, QueuePair* qx,
                   QueuePair* qy, CompletionQueue* scx, CompletionQueue* rcy, std::mt19937_64& rng) {
  d.x = x;
  d.y = y;
  d.qx = qx;
  d.qy = qy;
  d.send_cq_x = scx;
  d.recv_cq_y = rcy;
  d.src = testing::Register(*x->device, px, kSlots * kSlot, kMrAll);
  d.landing = testing::Register(*x->device, px, kSlots * kSlot, kMrAll);
  d.target = testing::Register(*y->device, py, kSlots * kSlot, kMrAll);
  d.read_source = testing::Register(*y->device, py, kReadSource, kMrAll);
  d.words = testing::Register(*y->device, py, kWords * 8, kMrAll);
  d.recv = testing::Register(*y->device, py, kRecvSlots * kSlot, kMrAll);
  for (auto& b : d.read_source.bytes) b = static_cast<uint8_t>(rng());
  d.read_source_model = d.read_source.bytes;
  d.target_model = d.target.bytes;
  for (size_t w = 0; w < kWords; ++w) {
    d.word_model[w] = rng();
    std::memcpy(d.words.bytes.data() + w * 8, &d.word_model[w], 8);
  }
}

void PostReceives(Direction& d) {
  while (d.next_recv_id - d.next_recv_done < kRecvDepth) {
    const uint64_t id = d.next_recv_id++;
    const size_t slot = id % kRecvSlots;
    // Two SGEs, so messages scatter across a boundary.
    RecvWr wr{id, {d.recv.At(slot * kSlot, kSlot / 2), d.recv.At(slot * kSlot + kSlot / 2, kSlot / 2)}};
    ASSERT_EQ(d.y->device->PostRecv(d.qy, std::move(wr)), 0);
    ++d.receives_free;
  }
}

uint32_t RandomLength(std::mt19937_64& rng, uint32_t min) {
  const uint64_t r = rng() % 100;
  uint32_t len = r < 60 ? rng() % 257 : r < 90 ? 257 + rng() % (2048 - 256) : 2049 + rng() % (kSlot - 2048);
  return std::max(len, min);
}

WcOpcode SendWcOpcode(SendOpcode op) {
  switch (op) {
    case SendOpcode::kRdmaWrite:
    case SendOpcode::kRdmaWriteWithImm: return WcOpcode::kRdmaWrite;
    case SendOpcode::kRdmaRead: return WcOpcode::kRdmaRead;
    case SendOpcode::kAtomicCmpAndSwp: return WcOpcode::kCompSwap;
    case SendOpcode::kAtomicFetchAndAdd: return WcOpcode::kFetchAdd;
    default: return WcOpcode::kSend;
  }
}

// Posts one random operation from X to Y. Returns false if none could be posted now.
bool PostOne(Direction& d, std::mt19937_64& rng) {
  if (d.posted.size() >= kMaxOutstanding) return false;
  static const SendOpcode kOps[] = {SendOpcode::kSend, SendOpcode::kSend, SendOpcode::kRdmaWrite,
                                    SendOpcode::kRdmaWriteWithImm, SendOpcode::kRdmaRead, SendOpcode::kRdmaRead,
                                    SendOpcode::kAtomicCmpAndSwp, SendOpcode::kAtomicFetchAndAdd};
  SendOpcode opc = kOps[rng() % std::size(kOps)];
  if ((opc == SendOpcode::kSend || opc == SendOpcode::kRdmaWriteWithImm) && d.receives_free == 0)
    opc = SendOpcode::kRdmaWrite;  // no receive to consume: never provoke RNR here
  const bool needs_receive = opc == SendOpcode::kSend || opc == SendOpcode::kRdmaWriteWithImm;

  PostedOp op;
  op.seq = d.next_seq++;
  op.opcode = opc;
  op.slot = op.seq % kSlots;
  // Signaled at random, and at least every 8th, so the send queue's unsignaled run stays short.
  op.signaled = rng() % 2 == 0 || op.seq % 8 == 0;
  SendWr wr;
  wr.wr_id = op.seq;
  wr.opcode = opc;
  wr.flags = op.signaled ? send_flags::kSignaled : 0;
  uint8_t* src = d.src.bytes.data() + op.slot * kSlot;
  switch (opc) {
    case SendOpcode::kSend:
    case SendOpcode::kRdmaWrite:
    case SendOpcode::kRdmaWriteWithImm: {
      op.length = RandomLength(rng, opc == SendOpcode::kSend ? 0 : 1);
      for (uint32_t i = 0; i < op.length; ++i) src[i] = static_cast<uint8_t>(rng());
      op.data.assign(src, src + op.length);
      if (opc == SendOpcode::kSend && op.length <= 256 && rng() % 4 == 0) {
        wr.flags |= send_flags::kInline;
        wr.inline_data = op.data;
      } else if (op.length > 1 && rng() % 3 == 0) {
        const uint32_t cut = 1 + rng() % (op.length - 1);  // two SGEs
        wr.sg_list = {d.src.At(op.slot * kSlot, cut), d.src.At(op.slot * kSlot + cut, op.length - cut)};
      } else {
        wr.sg_list = {d.src.At(op.slot * kSlot, op.length)};
      }
      if (opc != SendOpcode::kSend) {
        op.remote_off = op.slot * kSlot + rng() % (kSlot - op.length + 1);
        wr.remote_addr = d.target.mr.iova + op.remote_off;
        wr.rkey = d.target.mr.rkey;
      }
      if (needs_receive) {
        ExpectedReceive e;
        e.byte_len = op.length;
        if (opc == SendOpcode::kSend) {
          e.opcode = WcOpcode::kRecv;
          e.data = op.data;
        } else {
          e.opcode = WcOpcode::kRecvRdmaWithImm;
          wr.imm_data = static_cast<uint32_t>(op.seq);
          e.imm = wr.imm_data;
        }
        d.expected_receives.push_back(std::move(e));
        --d.receives_free;
      }
      break;
    }
    case SendOpcode::kRdmaRead: {
      op.length = RandomLength(rng, 1);
      op.remote_off = rng() % (kReadSource - op.length + 1);
      wr.remote_addr = d.read_source.mr.iova + op.remote_off;
      wr.rkey = d.read_source.mr.rkey;
      wr.sg_list = {d.landing.At(op.slot * kSlot, op.length)};
      break;
    }
    case SendOpcode::kAtomicCmpAndSwp:
    case SendOpcode::kAtomicFetchAndAdd: {
      op.length = 8;
      const size_t w = rng() % kWords;
      wr.remote_addr = d.words.mr.iova + w * 8;
      wr.rkey = d.words.mr.rkey;
      wr.sg_list = {d.landing.At(op.slot * kSlot, 8)};
      op.expect_original = d.word_model[w];
      if (opc == SendOpcode::kAtomicCmpAndSwp) {
        wr.compare_add = rng() % 2 ? d.word_model[w] : d.word_model[w] ^ 1;  // succeeds or not
        wr.swap = rng();
        if (wr.compare_add == d.word_model[w]) d.word_model[w] = wr.swap;
      } else {
        wr.compare_add = rng() % 1000;
        d.word_model[w] += wr.compare_add;
      }
      break;
    }
    default:
      break;
  }
  EXPECT_EQ(d.x->device->PostSend(d.qx, std::move(wr)), 0);
  ++d.ops_posted;
  ++d.per_opcode[static_cast<int>(opc)];
  d.posted.push_back(std::move(op));
  return true;
}

// An op is known complete: check what it left in memory.
void Confirm(Direction& d, const PostedOp& op) {
  ++d.ops_confirmed;
  const uint8_t* landing = d.landing.bytes.data() + op.slot * kSlot;
  switch (op.opcode) {
    case SendOpcode::kRdmaWrite:
    case SendOpcode::kRdmaWriteWithImm:
      ASSERT_EQ(0, std::memcmp(d.target.bytes.data() + op.remote_off, op.data.data(), op.length))
          << "WRITE seq " << op.seq;
      std::copy(op.data.begin(), op.data.end(), d.target_model.begin() + op.remote_off);
      break;
    case SendOpcode::kRdmaRead:
      ASSERT_EQ(0, std::memcmp(landing, d.read_source_model.data() + op.remote_off, op.length))
          << "READ seq " << op.seq;
      break;
    case SendOpcode::kAtomicCmpAndSwp:
    case SendOpcode::kAtomicFetchAndAdd: {
      uint64_t got;
      std::memcpy(&got, landing, 8);
      ASSERT_EQ(got, op.expect_original) << "atomic seq " << op.seq;
      break;
    }
    default:
      break;
  }
}

void CheckCompletions(Direction& d) {
  for (const Completion& c : Drain(d.send_cq_x)) {
    ASSERT_EQ(c.status, WcStatus::kSuccess) << ToString(c.status) << " wr_id " << c.wr_id;
    // In post order: everything before it was unsignaled and is complete too.
    while (!d.posted.empty() && d.posted.front().seq < c.wr_id) {
      ASSERT_FALSE(d.posted.front().signaled) << "signaled seq " << d.posted.front().seq << " skipped";
      Confirm(d, d.posted.front());
      d.posted.pop_front();
    }
    ASSERT_FALSE(d.posted.empty()) << "completion for wr_id " << c.wr_id << " nothing posted";
    const PostedOp& op = d.posted.front();
    ASSERT_EQ(op.seq, c.wr_id) << "duplicate or out-of-order completion";
    ASSERT_TRUE(op.signaled);
    EXPECT_EQ(c.opcode, SendWcOpcode(op.opcode));
    EXPECT_EQ(c.byte_len, op.length);
    EXPECT_EQ(c.qp_num, d.qx->qpn());
    Confirm(d, op);
    d.posted.pop_front();
  }
  for (const Completion& c : Drain(d.recv_cq_y)) {
    ASSERT_EQ(c.status, WcStatus::kSuccess) << ToString(c.status);
    ASSERT_EQ(c.wr_id, d.next_recv_done) << "receive completions out of order";
    ASSERT_FALSE(d.expected_receives.empty()) << "a receive completed that no message was sent for";
    const ExpectedReceive e = std::move(d.expected_receives.front());
    d.expected_receives.pop_front();
    EXPECT_EQ(c.opcode, e.opcode);
    EXPECT_EQ(c.byte_len, e.byte_len);
    EXPECT_EQ(c.qp_num, d.qy->qpn());
    EXPECT_EQ(c.src_qp, d.qx->qpn());
    if (e.imm) {
      EXPECT_EQ(c.wc_flags, wc_flags::kWithImm);
      EXPECT_EQ(c.imm_data, *e.imm);
    } else {
      EXPECT_EQ(c.wc_flags, 0u);
    }
    if (e.opcode == WcOpcode::kRecv) {
      const size_t slot = c.wr_id % kRecvSlots;
      ASSERT_TRUE(std::equal(e.data.begin(), e.data.end(), d.recv.bytes.begin() + slot * kSlot))
          << "SEND into receive " << c.wr_id;
    }
    ++d.next_recv_done;
    ++d.receives_completed;
  }
}

struct SoakCase {
  uint64_t seed;
  double corrupt;
  uint64_t ops;  // both directions together
  bool held_acks = false;  // both devices hold ACKs for replies (Device::AckTiming::kHeld), as the engine runs them
  bool early_retransmit = true;  // DeviceConfig::early_retransmit; false: every loss the NAKs miss waits for a timeout
};

class RcSoak : public ::testing::TestWithParam<SoakCase> {};

TEST_P(RcSoak, MixedOperationsBothWaysOnALossyNetworkMatchTheModel) {
  const SoakCase sc = GetParam();
  RcAttributes rc;
  rc.access = access::kRemoteWrite | access::kRemoteRead | access::kRemoteAtomic;
  rc.max_rd_atomic = 4;
  rc.max_dest_rd_atomic = 4;
  DeviceConfig device;
  device.early_retransmit = sc.early_retransmit;
  RcPair t(Mtu::k1024, rc, rc, {64, 64, 4, 4, 0}, 1024, device);
  if (sc.held_acks) t.a->ack_timing = t.b->ack_timing = Device::AckTiming::kHeld;
  wire::FaultConfig faults;
  faults.loss = 0.02;
  faults.duplicate = 0.01;
  faults.reorder = 0.02;
  faults.corrupt = sc.corrupt;
  faults.seed = sc.seed;
  t.fabric.network().SetDefaultFaults(faults);

  std::mt19937_64 rng(sc.seed * 0x9e3779b97f4a7c15ull + 1);
  Direction ab, ba;
  InitDirection(ab, t.a, t.b, t.pa, t.pb, t.qa, t.qb, t.sa, t.rb, rng);
  InitDirection(ba, t.b, t.a, t.pb, t.pa, t.qb, t.qa, t.sb, t.ra, rng);
  PostReceives(ab);
  PostReceives(ba);

  uint64_t total = 0;
  while (total < sc.ops && !::testing::Test::HasFailure()) {
    for (Direction* d : {&ab, &ba}) {
      const int n = rng() % 6;
      for (int i = 0; i < n && total < sc.ops; ++i)
        if (PostOne(*d, rng)) ++total;
    }
    const int steps = 1 + rng() % 8;
    for (int s = 0; s < steps; ++s)
      if (!t.fabric.Step()) break;
    for (Direction* d : {&ab, &ba}) {
      CheckCompletions(*d);
      PostReceives(*d);
    }
  }
  ASSERT_FALSE(::testing::Test::HasFailure());
  t.fabric.Pump(10'000'000);
  for (Direction* d : {&ab, &ba}) CheckCompletions(*d);

  for (Direction* d : {&ab, &ba}) {
    SCOPED_TRACE(d == &ab ? "a->b" : "b->a");
    // The send queue is empty, so every op (the unsignaled tail too) completed, successfully: a failure would have
    // left an error completion (IBTA 10.7.2.1), and none came.
    EXPECT_TRUE(d->qx->requester().state().sq.empty());
    while (!d->posted.empty()) {
      EXPECT_FALSE(d->posted.front().signaled);
      Confirm(*d, d->posted.front());
      d->posted.pop_front();
    }
    EXPECT_EQ(d->ops_confirmed, d->ops_posted);
    EXPECT_TRUE(d->expected_receives.empty());
    // What was posted, less what the messages consumed; and no message holds a receive half filled.
    EXPECT_EQ(d->qy->receive_queue().size(), d->next_recv_id - d->next_recv_done);
    EXPECT_EQ(d->qy->receive_queue().size(), d->receives_free);
    EXPECT_FALSE(d->qy->inbound().rqe.has_value());
    EXPECT_EQ(d->target.bytes, d->target_model);
    EXPECT_EQ(d->read_source.bytes, d->read_source_model);  // READs never write
    for (size_t w = 0; w < kWords; ++w) {
      uint64_t got;
      std::memcpy(&got, d->words.bytes.data() + w * 8, 8);
      EXPECT_EQ(got, d->word_model[w]) << "word " << w;
    }
    for (int op : {0, 1, 2, 4, 5, 6}) EXPECT_GT(d->per_opcode[op], 0u) << "opcode " << op << " never posted";
    EXPECT_EQ(d->qx->state(), QpState::kRts);
  }
  EXPECT_TRUE(Drain(t.sa).empty());
  EXPECT_TRUE(Drain(t.sb).empty());
  EXPECT_TRUE(Drain(t.ra).empty());
  EXPECT_TRUE(Drain(t.rb).empty());

  const DeviceCounters ca = t.a->device->counters(), cb = t.b->device->counters();
  const wire::FaultCounters net = t.fabric.network().total_counters();
  EXPECT_GT(net.dropped, 0u);
  EXPECT_GT(net.duplicated, 0u);
  EXPECT_GT(net.reordered, 0u);
  // Losses the NAKs miss (a lost NAK, a lost last ACK, a lost READ response at the end) were recovered by early
  // retransmission (tail probes, go-back-N), or without it by the local ACK timeout.
  if (sc.early_retransmit) {
    EXPECT_GT(ca.rc_early_retransmits + cb.rc_early_retransmits + ca.rc_tail_probes + cb.rc_tail_probes, 0u);
  } else {
    EXPECT_EQ(ca.rc_early_retransmits + cb.rc_early_retransmits + ca.rc_tail_probes + cb.rc_tail_probes, 0u);
    EXPECT_GT(ca.rc_retransmit_timeouts + cb.rc_retransmit_timeouts, 0u);
  }
  EXPECT_GT(ca.rx_out_of_sequence + cb.rx_out_of_sequence, 0u);  // PSN sequence NAKs drove resends too
  EXPECT_GT(ca.rc_duplicates + cb.rc_duplicates, 0u);
  if (sc.corrupt > 0) {
    EXPECT_GT(net.corrupted, 0u);
    EXPECT_GT(ca.rx_icrc_errors + cb.rx_icrc_errors, 0u);
  }
  std::printf("seed %llu corrupt %.3f: %llu ops (a->b %llu, b->a %llu), %llu/%llu receives, datagrams seen %llu "
              "dropped %llu dup %llu reordered %llu corrupted %llu; timeouts %llu, early retransmits %llu, "
              "dup requests %llu, "
              "out-of-sequence %llu, icrc errors %llu, sim time %.3f s\n",
              (unsigned long long)sc.seed, sc.corrupt, (unsigned long long)total,
              (unsigned long long)ab.ops_posted, (unsigned long long)ba.ops_posted,
              (unsigned long long)ab.receives_completed, (unsigned long long)ba.receives_completed,
              (unsigned long long)net.seen, (unsigned long long)net.dropped, (unsigned long long)net.duplicated,
              (unsigned long long)net.reordered, (unsigned long long)net.corrupted,
              (unsigned long long)(ca.rc_retransmit_timeouts + cb.rc_retransmit_timeouts),
              (unsigned long long)(ca.rc_early_retransmits + cb.rc_early_retransmits),
              (unsigned long long)(ca.rc_duplicates + cb.rc_duplicates),
              (unsigned long long)(ca.rx_out_of_sequence + cb.rx_out_of_sequence),
              (unsigned long long)(ca.rx_icrc_errors + cb.rx_icrc_errors), t.fabric.clock().NowNs() / 1e9);
}

// Six runs of 100,000 operations: 600,000 in all (about a second each; a few under ASan).
INSTANTIATE_TEST_SUITE_P(Seeds, RcSoak,
                         ::testing::Values(SoakCase{1, 0, 100000}, SoakCase{2, 0, 100000},
                                           SoakCase{3, 0, 100000, false, /*early_retransmit=*/false},
                                           SoakCase{4, 0.005, 100000}, SoakCase{5, 0, 100000, true},
                                           SoakCase{6, 0.005, 100000, true}),
                         [](const ::testing::TestParamInfo<SoakCase>& i) {
                           return "Seed" + std::to_string(i.param.seed) + (i.param.corrupt > 0 ? "Corrupt" : "") +
                                  (i.param.held_acks ? "HeldAcks" : "") +
                                  (i.param.early_retransmit ? "" : "TimeoutsOnly");
                         });

}  // namespace
}  // namespace uroce::emu
