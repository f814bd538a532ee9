// Writes the device fuzzer's seed corpus: real captures -- packets encoded with wire::EncodePacket and CM MADs with
// wire::EncodeCmMad, every field valid for the bench's live objects (QPNs, PSNs, R_Keys, addresses, comm IDs, which
// DescribeBench reads from a bench built as the fuzzer builds it) -- in the fuzzer's input format (device_fuzzer.h),
// alone or after the legitimate operation whose response they forge.
//
//   bazel run //emu/fuzz:corpus_generator -- $PWD/emu/fuzz/corpus
//
// The files are committed; run it again when the bench changes its numbers (the replay test checks that the seeds
// still reach what they aim at: see SeedsReachTheProtocolCode there).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "emu/fuzz/device_fuzzer.h"
#include "wire/cm_mad.h"
#include "wire/headers.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace uroce::emu::fuzz {
namespace {

// An input under construction.
class Input {
 public:
  explicit Input(uint8_t options = 0) : bytes_{options} {}
  Input& Add(uint8_t flags, uint8_t selector, std::span<const uint8_t> bytes) {
    const auto r = Record(flags, selector, bytes);
    bytes_.insert(bytes_.end(), r.begin(), r.end());
    return *this;
  }
  // A captured packet, ICRC sealed by the fuzzer for the flow it travels (kReseal), aimed at `target`.
  Input& Packet(const wire::PacketSpec& spec, std::span<const uint8_t> payload, Target target, uint8_t extra = 0,
                Memory memory = kRwMemory) {
    std::vector<uint8_t> p(wire::EncodedLength(spec, payload.size()));
    if (!wire::EncodePacket(spec, payload, p)) {
      std::fprintf(stderr, "cannot encode opcode 0x%02x\n", spec.bth.opcode);
      std::abort();
    }
    return Add(kRecordPacket | kReseal | extra, static_cast<uint8_t>(target | memory << 4), p);
  }
  Input& Mad(const wire::CmMad& mad, uint8_t from = 0, uint8_t extra = kPumpAfter) {
    const auto m = wire::EncodeCmMad(mad);
    return Add(kRecordCmMad | extra, from, m);
  }
  Input& Op(Operation op, std::vector<uint8_t> params, uint8_t extra = 0) {
    return Add(kRecordOperation | extra, op, params);
  }
  Input& Pump() { return Add(kRecordTime, 0, {}); }
  Input& WaitMs(uint16_t ms) {
    const uint8_t p[] = {static_cast<uint8_t>(ms), static_cast<uint8_t>(ms >> 8)};
    return Add(kRecordTime, kTimeMilliseconds, p);
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + i * 7);
  return b;
}

std::vector<uint8_t> Le16(uint16_t v) { return {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8)}; }

struct Corpus {
  std::string dir;
  int written = 0;
  void Write(const std::string& name, const Input& in) {
    char prefix[8];
    std::snprintf(prefix, sizeof prefix, "%02x_", written++);
    const std::string path = dir + "/" + prefix + name + ".bin";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(in.bytes().data(), 1, in.bytes().size(), f) != in.bytes().size()) {
      std::perror(path.c_str());
      std::exit(1);
    }
    std::fclose(f);
  }
};

wire::PacketSpec Spec(uint8_t opcode, uint32_t dest_qp, uint32_t psn, bool ack_req = true) {
  wire::PacketSpec s;
  s.bth.opcode = opcode;
  s.bth.dest_qp = dest_qp;
  s.bth.psn = psn & wire::kMask24;
  s.bth.ack_req = ack_req;
  return s;
}

void Generate(Corpus& c) {
  const LiveNumbers n = DescribeBench();
  constexpr uint8_t kPump = kPumpAfter;
  const auto payload64 = Bytes(64, 1), payload1k = Bytes(1024, 2), payload100 = Bytes(100, 3);

  // --- requests to the RC QP (the victim as responder), from the peer's address at the expected PSN ---
  {
    Input in;
    in.Packet(Spec(wire::opcode::kRcSendOnly, n.rc_qpn, n.rc_rq_psn), payload64, kRcQp, kPump);
    c.Write("rc_send_only", in);
  }
  {
    Input in;
    in.Packet(Spec(wire::opcode::kRcSendFirst, n.rc_qpn, n.rc_rq_psn, false), payload1k, kRcQp);
    in.Packet(Spec(wire::opcode::kRcSendMiddle, n.rc_qpn, n.rc_rq_psn + 1, false), payload1k, kRcQp);
    in.Packet(Spec(wire::opcode::kRcSendLast, n.rc_qpn, n.rc_rq_psn + 2), payload100, kRcQp, kPump);
    c.Write("rc_send_first_middle_last", in);
  }
  {
    Input in;
    auto s = Spec(wire::opcode::kRcSendOnlyWithImmediate, n.rc_qpn, n.rc_rq_psn);
    s.imm = wire::ImmDt{0x0d0c0b0a};
    s.bth.solicited = true;
    in.Packet(s, payload64, kRcQp, kPump);
    c.Write("rc_send_only_with_immediate", in);
  }
  {
    Input in;
    auto s = Spec(wire::opcode::kRcSendOnlyWithInvalidate, n.rc_qpn, n.rc_rq_psn);
    s.ieth = wire::Ieth{n.rkey[kWindowMemory]};  // the victim's type 2 window, bound to this QP
    in.Packet(s, payload64, kRcQp, kPump);
    c.Write("rc_send_only_with_invalidate", in);
  }
  {
    Input in;
    auto first = Spec(wire::opcode::kRcSendFirst, n.rc_qpn, n.rc_rq_psn, false);
    in.Packet(first, payload1k, kRcQp);
    auto last = Spec(wire::opcode::kRcSendLastWithInvalidate, n.rc_qpn, n.rc_rq_psn + 1);
    last.ieth = wire::Ieth{n.rkey[kWindowMemory]};
    in.Packet(last, payload64, kRcQp, kPump);
    c.Write("rc_send_last_with_invalidate", in);
  }
  {
    Input in;
    auto s = Spec(wire::opcode::kRcRdmaWriteOnly, n.rc_qpn, n.rc_rq_psn);
    s.reth = wire::Reth{n.iova[kRwMemory] + 16, n.rkey[kRwMemory], 64};
    in.Packet(s, payload64, kRcQp, kPump | kPatchKeys, kRwMemory);
    c.Write("rc_rdma_write_only", in);
  }
  {
    Input in;
    auto first = Spec(wire::opcode::kRcRdmaWriteFirst, n.rc_qpn, n.rc_rq_psn, false);
    first.reth = wire::Reth{n.iova[kRwMemory] + 100, n.rkey[kRwMemory], 2 * 1024 + 100};
    in.Packet(first, payload1k, kRcQp);
    in.Packet(Spec(wire::opcode::kRcRdmaWriteMiddle, n.rc_qpn, n.rc_rq_psn + 1, false), payload1k, kRcQp);
    auto last = Spec(wire::opcode::kRcRdmaWriteLastWithImmediate, n.rc_qpn, n.rc_rq_psn + 2);
    last.imm = wire::ImmDt{0x01020304};
    in.Packet(last, payload100, kRcQp, kPump);
    c.Write("rc_rdma_write_first_middle_last_with_immediate", in);
  }
  {
    Input in;
    auto s = Spec(wire::opcode::kRcRdmaWriteOnlyWithImmediate, n.rc_qpn, n.rc_rq_psn);
    s.reth = wire::Reth{n.iova[kWindowMemory], n.rkey[kWindowMemory], 64};
    s.imm = wire::ImmDt{0x44332211};
    in.Packet(s, payload64, kRcQp, kPump | kPatchKeys, kWindowMemory);
    c.Write("rc_rdma_write_only_with_immediate_through_window", in);
  }
  {
    Input in;
    auto s = Spec(wire::opcode::kRcRdmaWriteOnly, n.rc_qpn, n.rc_rq_psn);
    s.reth = wire::Reth{n.iova[kCanaryMemory], n.rkey[kCanaryMemory], 64};
    in.Packet(s, payload64, kRcQp, kPump | kPatchKeys, kCanaryMemory);
    c.Write("rc_rdma_write_to_canary_is_naked", in);
  }
  {
    Input in;
    auto s = Spec(wire::opcode::kRcRdmaReadRequest, n.rc_qpn, n.rc_rq_psn);
    s.reth = wire::Reth{n.iova[kReadOnlyMemory], n.rkey[kReadOnlyMemory], 1000};
    in.Packet(s, {}, kRcQp, kPump | kPatchKeys, kReadOnlyMemory);
    // The same READ again: a duplicate, answered from the saved response (IBTA 9.7.5.1.6).
    in.Packet(s, {}, kRcQp, kPump);
    c.Write("rc_rdma_read_request_and_duplicate", in);
  }
  {
    Input in;
    auto s = Spec(wire::opcode::kRcCompareSwap, n.rc_qpn, n.rc_rq_psn);
    s.atomic = wire::AtomicEth{n.iova[kRwMemory] + 64, n.rkey[kRwMemory], 0x1111, 0};
    in.Packet(s, {}, kRcQp, kPump | kPatchKeys, kRwMemory);
    auto f = Spec(wire::opcode::kRcFetchAdd, n.rc_qpn, n.rc_rq_psn + 1);
    f.atomic = wire::AtomicEth{n.iova[kRwMemory] + 64, n.rkey[kRwMemory], 5, 0};
    in.Packet(f, {}, kRcQp, kPump | kPatchKeys, kRwMemory);
    in.Packet(f, {}, kRcQp, kPump);  // duplicate: the saved original again, not a second add
    c.Write("rc_compare_swap_fetch_add_duplicate", in);
  }
  {
    Input in;
    in.Packet(Spec(wire::opcode::kRcSendOnly, n.rc_qpn, n.rc_rq_psn + 5), payload64, kRcQp, kPump);  // a gap: NAK
    in.Packet(Spec(wire::opcode::kRcSendOnly, n.rc_qpn, n.rc_rq_psn - 1), payload64, kRcQp, kPump);  // duplicate
    c.Write("rc_send_out_of_sequence", in);
  }
  {
    Input in;
    in.Packet(Spec(wire::opcode::kRcSendOnly, n.rc_on_srq_qpn, n.rc_rq_psn), payload64, kRcOnSrqQp, kPump);
    c.Write("rc_on_srq_send_only", in);
  }
  {
    Input in;  // PSN relative to what the QP expects: delta 0
    in.Packet(Spec(wire::opcode::kRcSendOnly, n.rc_qpn, 0), payload64, kRcQp, kPump | kPsnRelative);
    in.Packet(Spec(wire::opcode::kRcSendOnly, n.rc_qpn, 0), payload64, kRcQp, kPump | kPsnRelative);
    c.Write("rc_send_only_psn_relative", in);
  }
  {
    Input in;  // no reseal: the ICRC check drops it
    std::vector<uint8_t> p(wire::EncodedLength(Spec(wire::opcode::kRcSendOnly, n.rc_qpn, n.rc_rq_psn), 64));
    (void)wire::EncodePacket(Spec(wire::opcode::kRcSendOnly, n.rc_qpn, n.rc_rq_psn), payload64, p);
    in.Add(kRecordPacket | kPump, kKeepQpn, p);
    c.Write("rc_send_only_bad_icrc", in);
  }
  {
    Input in;  // from an address the QP is not connected to
    in.Packet(Spec(wire::opcode::kRcSendOnly, n.rc_qpn, n.rc_rq_psn), payload64, kRcQp, kPump | kFromStranger);
    c.Write("rc_send_only_from_stranger", in);
  }

  // --- responses to the RC QP (the victim as requester), forged before the peer's real ones arrive ---
  const uint32_t sq = n.rc_sq_psn;
  const std::vector<uint8_t> send64 = {64, 0, 0, 0};            // kOpRcSend: 64 bytes, offset 0, SEND
  const std::vector<uint8_t> read64 = {64, 0, 0, 0, 0};        // kOpRcRead: 64 bytes of the peer's rw into dst
  const std::vector<uint8_t> read2500 = {0xc4, 0x09, 0, 0, 0x42};  // kOpRcRead: 2500 bytes of rw into ours
  const std::vector<uint8_t> atomic = {0, 0, 1, 7, 0, 0, 0};    // kOpRcAtomic: CAS at offset 0
  {
    Input in;
    in.Op(kOpRcSend, send64);
    auto s = Spec(wire::opcode::kRcAcknowledge, n.rc_qpn, sq, false);
    s.aeth = wire::Aeth::Ack(wire::kInvalidCredits, 1);
    in.Packet(s, {}, kRcQp, kPump);
    c.Write("rc_acknowledge", in);
  }
  {
    Input in;
    in.Op(kOpRcSend, send64);
    in.Op(kOpRcSend, send64);
    auto s = Spec(wire::opcode::kRcAcknowledge, n.rc_qpn, sq + 1, false);
    s.aeth = wire::Aeth::Nak(wire::NakCode::kPsnSeqError, 1);
    in.Packet(s, {}, kRcQp, kPump);
    c.Write("rc_nak_psn_sequence_error", in);
  }
  for (auto [code, name] : {std::pair{wire::NakCode::kInvalidRequest, "rc_nak_invalid_request"},
                            std::pair{wire::NakCode::kRemoteAccessError, "rc_nak_remote_access_error"},
                            std::pair{wire::NakCode::kRemoteOperationalError, "rc_nak_remote_operational_error"},
                            std::pair{wire::NakCode::kInvalidRdRequest, "rc_nak_invalid_rd_request"}}) {
    Input in;
    in.Op(kOpRcSend, send64);
    auto s = Spec(wire::opcode::kRcAcknowledge, n.rc_qpn, sq, false);
    s.aeth = wire::Aeth::Nak(code, 0);
    in.Packet(s, {}, kRcQp, kPump);
    c.Write(name, in);
  }
  {
    Input in;
    in.Op(kOpRcSend, send64);
    auto s = Spec(wire::opcode::kRcAcknowledge, n.rc_qpn, sq, false);
    s.aeth = wire::Aeth::RnrNak(1, 0);
    in.Packet(s, {}, kRcQp);
    in.Packet(s, {}, kRcQp, kPump);
    in.WaitMs(1);
    c.Write("rc_rnr_nak", in);
  }
  {
    Input in;
    in.Op(kOpRcRead, read64);
    auto s = Spec(wire::opcode::kRcRdmaReadResponseOnly, n.rc_qpn, sq, false);
    s.aeth = wire::Aeth::Ack(wire::kInvalidCredits, 1);
    in.Packet(s, payload64, kRcQp, kPump);
    c.Write("rc_rdma_read_response_only", in);
  }
  {
    // A READ of 2500 bytes at MTU 1024 takes three responses: FIRST and LAST carry the AETH (IBTA 9.7.5.1.6).
    Input in;
    in.Op(kOpRcRead, read2500);
    auto f = Spec(wire::opcode::kRcRdmaReadResponseFirst, n.rc_qpn, sq, false);
    f.aeth = wire::Aeth::Ack(wire::kInvalidCredits, 1);
    in.Packet(f, payload1k, kRcQp);
    in.Packet(Spec(wire::opcode::kRcRdmaReadResponseMiddle, n.rc_qpn, sq + 1, false), payload1k, kRcQp);
    auto l = Spec(wire::opcode::kRcRdmaReadResponseLast, n.rc_qpn, sq + 2, false);
    l.aeth = wire::Aeth::Ack(wire::kInvalidCredits, 1);
    in.Packet(l, Bytes(2500 - 2048, 4), kRcQp, kPump);
    c.Write("rc_rdma_read_response_first_middle_last", in);
  }
  {
    Input in;
    in.Op(kOpRcAtomic, atomic);
    auto s = Spec(wire::opcode::kRcAtomicAcknowledge, n.rc_qpn, sq, false);
    s.aeth = wire::Aeth::Ack(wire::kInvalidCredits, 1);
    s.atomic_ack = wire::AtomicAckEth{0x1122334455667788ull};
    in.Packet(s, {}, kRcQp, kPump);
    c.Write("rc_atomic_acknowledge", in);
  }
  {
    Input in;  // an ACK for a PSN never sent: counted, ignored
    auto s = Spec(wire::opcode::kRcAcknowledge, n.rc_qpn, sq + 100, false);
    s.aeth = wire::Aeth::Ack(wire::kInvalidCredits, 1);
    in.Packet(s, {}, kRcQp, kPump);
    c.Write("rc_unexpected_acknowledge", in);
  }
  {
    Input in;
    wire::PacketSpec s;
    s.bth.opcode = wire::opcode::kCnp;
    s.bth.becn = true;
    s.bth.dest_qp = n.rc_qpn;
    const uint8_t reserved[16] = {};
    in.Packet(s, reserved, kRcQp, kPump);
    s.bth.dest_qp = n.ud_qpn;
    in.Packet(s, reserved, kUdQp, kPump);
    c.Write("cnp_to_rc_and_ud", in);
  }

  // --- UC ---
  {
    Input in;
    in.Packet(Spec(0x24, n.uc_qpn, n.uc_rq_psn, false), payload64, kUcQp, kPump);  // UC_SEND_ONLY
    c.Write("uc_send_only", in);
  }
  {
    Input in;
    in.Packet(Spec(0x20, n.uc_qpn, n.uc_rq_psn, false), payload1k, kUcQp);  // FIRST
    auto last = Spec(0x23, n.uc_qpn, n.uc_rq_psn + 1, false);             // LAST_WITH_IMMEDIATE
    last.imm = wire::ImmDt{0x55};
    in.Packet(last, payload64, kUcQp, kPump);
    c.Write("uc_send_first_last_with_immediate", in);
  }
  {
    Input in;
    auto s = Spec(0x2B, n.uc_qpn, n.uc_rq_psn, false);  // UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
    s.reth = wire::Reth{n.iova[kRwMemory] + 512, n.rkey[kRwMemory], 64};
    s.imm = wire::ImmDt{0x66};
    in.Packet(s, payload64, kUcQp, kPump | kPatchKeys, kRwMemory);
    c.Write("uc_rdma_write_only_with_immediate", in);
  }
  {
    Input in;
    auto first = Spec(0x26, n.uc_qpn, n.uc_rq_psn, false);  // UC_RDMA_WRITE_FIRST
    first.reth = wire::Reth{n.iova[kRwMemory], n.rkey[kRwMemory], 1024 + 64};
    in.Packet(first, payload1k, kUcQp);
    in.Packet(Spec(0x28, n.uc_qpn, n.uc_rq_psn + 2, false), payload64, kUcQp, kPump);  // LAST after a lost packet
    c.Write("uc_rdma_write_first_last_after_gap", in);
  }

  // --- UD ---
  {
    Input in;
    auto s = Spec(wire::opcode::kUdSendOnly, n.ud_qpn, 0, false);
    s.deth = wire::Deth{n.ud_qkey, 0, n.peer_ud_qpn};
    in.Packet(s, payload64, kUdQp, kPump);
    auto i = Spec(wire::opcode::kUdSendOnlyWithImmediate, n.ud_qpn, 1, false);
    i.deth = wire::Deth{n.ud_qkey, 0, n.peer_ud_qpn};
    i.imm = wire::ImmDt{0x77};
    in.Packet(i, payload100, kUdQp, kPump | kFromStranger);
    auto wrong = Spec(wire::opcode::kUdSendOnly, n.ud_qpn, 2, false);
    wrong.deth = wire::Deth{0x12345678, 0, n.peer_ud_qpn};  // wrong Q_Key
    in.Packet(wrong, payload64, kUdQp, kPump);
    c.Write("ud_send_only_with_immediate_and_wrong_qkey", in);
  }

  // --- XRC target (requests naming the victim's XRC SRQ) and initiator (responses) ---
  {
    Input in;
    auto s = Spec(0xA4, n.xrc_target_qpn, n.xrc_rq_psn);  // XRC_SEND_ONLY
    s.xrc = wire::XrcEth{0, n.xrc_srqn};
    in.Packet(s, payload64, kXrcTargetQp, kPump | kPatchSrqn);
    c.Write("xrc_send_only", in);
  }
  {
    Input in;
    auto f = Spec(0xA0, n.xrc_target_qpn, n.xrc_rq_psn, false);  // XRC_SEND_FIRST
    f.xrc = wire::XrcEth{0, n.xrc_srqn};
    in.Packet(f, payload1k, kXrcTargetQp, kPatchSrqn);
    auto l = Spec(0xA2, n.xrc_target_qpn, n.xrc_rq_psn + 1);  // XRC_SEND_LAST
    l.xrc = wire::XrcEth{0, n.xrc_srqn};
    in.Packet(l, payload64, kXrcTargetQp, kPump | kPatchSrqn);
    c.Write("xrc_send_first_last", in);
  }
  {
    Input in;
    auto w = Spec(0xAA, n.xrc_target_qpn, n.xrc_rq_psn);  // XRC_RDMA_WRITE_ONLY
    w.xrc = wire::XrcEth{0, n.xrc_srqn};
    w.reth = wire::Reth{n.iova[kRwMemory], n.rkey[kRwMemory], 64};
    in.Packet(w, payload64, kXrcTargetQp, kPump | kPatchSrqn | kPatchKeys, kRwMemory);
    auto r = Spec(0xAC, n.xrc_target_qpn, n.xrc_rq_psn + 1);  // XRC_RDMA_READ_REQUEST
    r.xrc = wire::XrcEth{0, n.xrc_srqn};
    r.reth = wire::Reth{n.iova[kReadOnlyMemory], n.rkey[kReadOnlyMemory], 1024};
    in.Packet(r, {}, kXrcTargetQp, kPump | kPatchSrqn | kPatchKeys, kReadOnlyMemory);
    auto a = Spec(0xB4, n.xrc_target_qpn, n.xrc_rq_psn + 2);  // XRC_FETCH_ADD
    a.xrc = wire::XrcEth{0, n.xrc_srqn};
    a.atomic = wire::AtomicEth{n.iova[kRwMemory] + 8, n.rkey[kRwMemory], 1, 0};
    in.Packet(a, {}, kXrcTargetQp, kPump | kPatchSrqn | kPatchKeys, kRwMemory);
    c.Write("xrc_write_read_fetch_add", in);
  }
  {
    Input in;
    auto s = Spec(0xA4, n.xrc_target_qpn, n.xrc_rq_psn);
    s.xrc = wire::XrcEth{0, 0xabcdef};  // no such SRQ: NAK invalid request
    in.Packet(s, payload64, kXrcTargetQp, kPump);
    c.Write("xrc_send_only_unknown_srq", in);
  }
  {
    Input in;
    in.Op(kOpXrcPost, {64, 0, 0});  // a SEND of 64 bytes to the peer's XRC SRQ
    auto s = Spec(0xB1, n.xrc_initiator_qpn, sq, false);  // XRC_ACKNOWLEDGE
    s.aeth = wire::Aeth::Ack(wire::kInvalidCredits, 1);
    in.Packet(s, {}, kXrcInitiatorQp, kPump);
    c.Write("xrc_acknowledge_to_initiator", in);
  }
  {
    Input in;
    in.Op(kOpXrcPost, {200, 0, 2});  // a READ of 200 bytes
    auto s = Spec(0xB0, n.xrc_initiator_qpn, sq, false);  // XRC_RDMA_READ_RESPONSE_ONLY
    s.aeth = wire::Aeth::Ack(wire::kInvalidCredits, 1);
    in.Packet(s, Bytes(200, 9), kXrcInitiatorQp, kPump);
    c.Write("xrc_read_response_to_initiator", in);
  }

  // --- CM MADs to QP1 ---
  const uint64_t kTid = 0x1234;
  {
    Input in;
    wire::CmReq req;
    req.local_comm_id = 0x1111;
    req.service_id = n.listen_service;
    req.local_ca_guid = n.peer_guid;
    req.local_qpn = n.peer_rc_qpn;
    req.starting_psn = 7;
    req.responder_resources = req.initiator_depth = 1;
    req.remote_cm_response_timeout = req.local_cm_response_timeout = 20;
    req.retry_count = req.rnr_retry_count = 7;
    req.path_mtu = 3;
    req.max_cm_retries = 15;
    req.primary.local_ack_timeout = 17;
    req.primary.hop_limit = 64;
    in.Mad({kTid, 0, req});
    in.Mad({kTid, 0, req});  // a duplicate: REP again
    wire::CmRtu rtu;
    rtu.local_comm_id = 0x1111;
    rtu.remote_comm_id = 0;  // the victim's id is not known here; the fuzzer learns it
    in.Mad({kTid, 0, rtu});
    c.Write("cm_req_to_listener_duplicate_rtu", in);
    Input stranger(1);  // from the stranger, with the victim rejecting REQs
    stranger.Mad({kTid, 0, req}, 1);
    c.Write("cm_req_from_stranger_rejected", stranger);
    Input unknown;
    req.service_id = 0x999;
    unknown.Mad({kTid, 0, req});
    c.Write("cm_req_no_listener", unknown);
  }
  {
    Input in;
    wire::CmRep rep;
    rep.local_comm_id = n.active_req_sent_remote;
    rep.remote_comm_id = n.active_req_sent_local;
    rep.local_qpn = n.peer_rc_qpn;
    rep.starting_psn = 5;
    rep.responder_resources = rep.initiator_depth = 1;
    rep.rnr_retry_count = 7;
    rep.local_ca_guid = n.peer_guid;
    in.Mad({kTid, 0, rep});
    in.Mad({kTid, 0, rep});  // a duplicate when ESTABLISHED: the RTU again
    c.Write("cm_rep_for_req_sent", in);
  }
  {
    Input in;
    wire::CmRtu rtu;
    rtu.local_comm_id = n.passive_rep_sent_remote;
    rtu.remote_comm_id = n.passive_rep_sent_local;
    in.Mad({kTid, 0, rtu});
    c.Write("cm_rtu_for_rep_sent", in);
  }
  {
    Input in;
    wire::CmDreq dreq;
    dreq.local_comm_id = n.passive_established_remote;
    dreq.remote_comm_id = n.passive_established_local;
    dreq.remote_qpn = n.rc_qpn;
    in.Mad({kTid, 0, dreq});
    in.Mad({kTid, 0, dreq});  // again in TIMEWAIT: DREP
    in.WaitMs(1000);
    c.Write("cm_dreq_for_established", in);
  }
  {
    Input in;
    wire::CmDrep drep;
    drep.local_comm_id = n.active_dreq_sent_remote;
    drep.remote_comm_id = n.active_dreq_sent_local;
    in.Mad({kTid, 0, drep});
    in.WaitMs(1000);
    c.Write("cm_drep_for_dreq_sent", in);
  }
  {
    Input in;
    wire::CmRej rej;
    rej.local_comm_id = n.active_req_sent_remote;
    rej.remote_comm_id = n.active_req_sent_local;
    rej.message_rejected = wire::CmMessageRef::kReq;
    rej.reason = static_cast<uint16_t>(wire::CmRejectReason::kConsumerDefined);
    in.Mad({kTid, 0, rej});
    c.Write("cm_rej_for_req_sent", in);
    Input timeout;
    rej.reason = static_cast<uint16_t>(wire::CmRejectReason::kTimeout);
    rej.reject_info_length = 8;
    std::memcpy(rej.ari.data(), &n.victim_guid, 8);
    timeout.Mad({kTid, 0, rej});
    c.Write("cm_rej_timeout_for_req_sent", timeout);
  }
  {
    Input in;
    wire::CmMra mra;
    mra.local_comm_id = n.active_req_sent_remote;
    mra.remote_comm_id = n.active_req_sent_local;
    mra.message_mraed = wire::CmMessageRef::kReq;
    mra.service_timeout = 20;
    in.Mad({kTid, 0, mra});
    wire::CmMra rep_mra;
    rep_mra.local_comm_id = n.passive_rep_sent_remote;
    rep_mra.remote_comm_id = n.passive_rep_sent_local;
    rep_mra.message_mraed = wire::CmMessageRef::kRep;
    rep_mra.service_timeout = 18;
    in.Mad({kTid, 0, rep_mra});
    in.WaitMs(5000);
    c.Write("cm_mra_for_req_and_rep", in);
  }
  {
    Input in;
    wire::CmSidrReq sidr;
    sidr.request_id = 0x42;
    sidr.service_id = n.listen_service;
    in.Mad({kTid, 0, sidr});
    wire::CmSidrRep rep;
    rep.request_id = 0x43;
    in.Mad({kTid, 0, rep});
    c.Write("cm_sidr_req_and_stray_rep", in);
  }

  // --- legitimate traffic, state changes and time ---
  {
    Input in;
    in.Op(kOpRcSend, {0, 4, 0, 1, 1, 2, 3, 4});                // 1024 bytes with immediate
    in.Op(kOpRcWrite, {0, 8, 0, 1, 1, 0, 0, 0, 0});          // 2048 bytes with immediate to the peer's rw
    in.Op(kOpRcRead, {200, 0, 0, 0, 1});                      // 200 bytes from the peer's read-only region
    in.Op(kOpRcAtomic, {3, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0});   // fetch-and-add
    in.Op(kOpUcPost, {0, 2, 1, 0, 0});                        // UC WRITE
    in.Op(kOpUdSend, {100, 0, 1});                            // UD SEND with immediate
    in.Op(kOpXrcPost, {0, 3, 0});                             // XRC SEND of 768 bytes
    in.Op(kOpPeerRc, {0, 100, 0, 0, 0});                      // the peer SENDs to the victim
    in.Op(kOpPeerRc, {1, 0, 2, 16, 0});                       // ... WRITEs 512 bytes into rw
    in.Op(kOpPeerRc, {2, 200, 0, 0, 0});                      // ... READs rw
    in.Op(kOpPeerRc, {3, 1, 0, 64, 0});                       // ... fetch-and-add on rw
    in.Op(kOpPeerOther, {0, 64, 0});                          // UC SEND
    in.Op(kOpPeerOther, {2, 64, 0});                          // UD SEND
    in.Op(kOpPeerOther, {3, 64, 0});                          // XRC SEND into the victim's XRC SRQ
    in.Op(kOpPostRecv, {0, 7});
    in.Pump();
    in.Op(kOpPoll, {});
    c.Write("legitimate_traffic", in);
  }
  {
    Input in(kOptionHeldAcks);
    in.Op(kOpPeerRc, {0, 64, 0, 0, 0});
    in.Op(kOpPeerRc, {1, 0, 1, 0, 0});
    in.Op(kOpRcSend, send64);
    in.Packet(Spec(wire::opcode::kRcSendOnly, n.rc_qpn, n.rc_rq_psn + 2), payload64, kRcQp);
    in.WaitMs(1);
    c.Write("held_acks_with_traffic", in);
  }
  {
    Input in;
    in.Op(kOpRcSend, send64);
    in.Op(kOpModifyQp, {0, 1});  // the RC QP to SQD while its SEND is in flight
    in.Pump();
    in.Op(kOpModifyQp, {0, 2});  // back to RTS
    in.Op(kOpModifyQp, {2, 0});  // UC to ERR: its receives are flushed
    in.Op(kOpModifyQp, {4, 3, 0, 1, 0, 0, 0, 0, 0, 0});  // the XRC target through RESET to RTS, rq_psn 0x100
    in.Packet(Spec(wire::opcode::kRcSendOnly, n.rc_qpn, n.rc_rq_psn), payload64, kRcQp, kPump);
    c.Write("qp_state_changes", in);
  }
  {
    Input in;
    in.Op(kOpMemory, {0});  // deregister rw
    in.Op(kOpPeerRc, {1, 64, 0, 0, 0});  // the peer WRITEs into it: remote access error
    auto s = Spec(wire::opcode::kRcRdmaWriteOnly, n.rc_qpn, n.rc_rq_psn);
    s.reth = wire::Reth{n.iova[kRwMemory], n.rkey[kRwMemory], 64};
    in.Packet(s, payload64, kRcQp, kPump);
    in.Op(kOpMemory, {1});  // registered again (new keys)
    in.Op(kOpMemory, {2});  // the window bound again
    in.Op(kOpMemory, {3});  // and invalidated
    in.Pump();
    c.Write("memory_deregistered_mid_traffic", in);
  }
  {
    Input in;
    in.Op(kOpCm, {0, 1});  // DREQ on the passive established connection
    in.Op(kOpCm, {2, 2});  // destroy the connection in REP_SENT: REJ
    in.Op(kOpCm, {3, 1});  // a new REQ to the peer's answering service
    in.Op(kOpCm, {6, 0});  // SIDR_REQ
    in.Op(kOpCm, {8, 0});  // the peer is gone
    in.Pump();
    in.WaitMs(5000);
    in.WaitMs(5000);
    c.Write("cm_operations_and_timers", in);
  }
  {
    Input in;
    in.Op(kOpRcSend, send64);
    in.Op(kOpRcRead, read64);
    in.Op(kOpRcRead, read2500);
    in.Add(kRecordTime, kTimeMilliseconds | kTimeStall, Le16(100));  // nothing delivered for 100 ms: a timeout
    for (int i = 0; i < 8; ++i) in.WaitMs(100);
    in.Op(kOpPoll, {});
    c.Write("rc_timers", in);
  }
  {
    Input in;
    std::vector<uint8_t> big = Le16(3000);
    big.push_back(0);
    big.push_back(0);
    in.Op(kOpRcSend, big);  // longer than the peer's receive: its QP fails, ours sees a NAK
    in.Pump();
    c.Write("rc_send_too_long_for_peer", in);
  }
}

}  // namespace
}  // namespace uroce::emu::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  uroce::emu::fuzz::Corpus corpus{argv[1]};
  uroce::emu::fuzz::Generate(corpus);
  std::printf("%d seeds written to %s\n", corpus.written, argv[1]);
  return 0;
}
