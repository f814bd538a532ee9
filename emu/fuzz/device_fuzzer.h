// The input format of the stateful device fuzzer (device_fuzzer.cc), shared with the corpus generator
// (corpus_generator.cc) and the replay test, and the live numbers of its test bench.
//
// An input is one options byte, then records until the input ends:
//
//   [u8 flags][u8 selector][u16 length, little-endian][length bytes]
//
// The two low bits of `flags` say what a record is:
//   kRecordPacket     the bytes are a RoCEv2 packet (BTH .. ICRC) sent to the victim; `selector` and the other flag bits
//                     say which live object it is made to reach (see below)
//   kRecordCmMad      the bytes are a CM MAD (IBTA 13.4, padded to 256 bytes unless kRawMadLength), sent to the
//                     victim's QP1 as a UD SEND_ONLY with the GSI's Q_Key, sealed
//   kRecordOperation  a legitimate verb (`selector` picks it, the bytes are its parameters): a post on a live QP, a
//                     receive, a QP state change, a CM call, a memory registration change, a poll
//   kRecordTime       time passes: the bytes (u16 LE) are how many microseconds (milliseconds with kTimeMilliseconds
//                     in `selector`), during which the fabric delivers and timers fire in order -- or, with
//                     kTimeStall, nothing is delivered until the end (a stalled network: timeouts fire first)
//
// The fuzzer reaches real QPs because a packet record names a live object rather than a QPN: the selector's low
// nibble (a Target) is written into the BTH's DestQP, its high nibble (a Memory) picks the registered memory that
// kPatchKeys writes into a RETH or AtomicETH. Most packets should pass the ICRC check to reach the protocol code,
// so kReseal seals the ICRC for the flow the datagram really travels (IBTA A17.3.3); without it the bytes go as they
// are.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace uroce::emu::fuzz {

// --- the options byte ---
inline constexpr uint8_t kOptionReqAnswerMask = 0x03;  // the victim answers a REQ with: 0 REP, 1 REJ, 2 Drop, 3 nothing
inline constexpr uint8_t kOptionRejectReps = 0x04;     // ... a REP with a REJ instead of the RTU
inline constexpr uint8_t kOptionIgnoreDreqs = 0x08;    // ... a DREQ with nothing instead of the DREP
inline constexpr uint8_t kOptionHeldAcks = 0x10;       // the victim receives with AckTiming::kHeld (as the engine does)
inline constexpr uint8_t kOptionDropSidr = 0x20;       // ... a SIDR_REQ with Drop instead of a SIDR_REP

// --- records ---
inline constexpr uint8_t kRecordPacket = 0;
inline constexpr uint8_t kRecordCmMad = 1;
inline constexpr uint8_t kRecordOperation = 2;
inline constexpr uint8_t kRecordTime = 3;
inline constexpr uint8_t kRecordTypeMask = 0x03;
inline constexpr size_t kRecordHeaderSize = 4;

// Packet and CM MAD flags.
inline constexpr uint8_t kReseal = 0x04;        // seal the ICRC for the real flow
inline constexpr uint8_t kFromStranger = 0x08;  // sent from a third node, which no connected QP talks to
inline constexpr uint8_t kPsnRelative = 0x10;   // BTH PSN := the target's next expected PSN + (int8) low byte of PSN
inline constexpr uint8_t kPatchSrqn = 0x20;     // XRCETH SRQ number := the victim's XRC SRQ
inline constexpr uint8_t kPatchKeys = 0x40;     // RETH / AtomicETH R_Key and address := within the chosen memory
inline constexpr uint8_t kPumpAfter = 0x80;     // pump the fabric after this record
inline constexpr uint8_t kRawMadLength = 0x40;  // CM MAD: send the bytes as long as they are (no padding to 256)

// Packet selector, low nibble: the object whose number goes into the BTH's DestQP.
enum Target : uint8_t {
  kKeepQpn = 0,      // the DestQP as it is in the bytes
  kRcQp = 1,         // the RC QP connected to the peer's
  kRcOnSrqQp = 2,    // an RC QP that takes its receives from a basic SRQ
  kUcQp = 3,
  kUdQp = 4,
  kXrcTargetQp = 5,  // XRC_RECV, its SRQ in the victim's XRC domain
  kXrcInitiatorQp = 6,
  kGsiQp = 7,        // QP1
  kMulticastQp = 8,  // 0xFFFFFF
  kUnknownQp = 9,    // a QPN nobody has
  kTargetCount = 10,
};
// Packet selector, high nibble: the registered memory kPatchKeys names.
enum Memory : uint8_t {
  kRwMemory = 0,      // remote read, write and atomic
  kReadOnlyMemory = 1,  // remote read only: must keep its bytes
  kCanaryMemory = 2,  // local write only, never in a work request: must keep its bytes
  kRecvMemory = 3,    // local write, the receive buffers
  kSrcMemory = 4,     // local read only, what the victim sends from: must keep its bytes
  kDstMemory = 5,     // local write, where the victim's READs and atomics land
  kWindowMemory = 6,  // a type 2 memory window on the RC QP over the first half of kRwMemory
  kMemoryCount = 7,
};

// Operation selectors (selector % kOperationCount).
enum Operation : uint8_t {
  kOpRcSend = 0,     // victim RC QP: SEND / SEND with immediate / SEND with invalidate to the peer
  kOpRcWrite,        // victim RC QP: RDMA WRITE (with immediate) to the peer's memory
  kOpRcRead,         // victim RC QP: RDMA READ of the peer's memory
  kOpRcAtomic,       // victim RC QP: compare-and-swap / fetch-and-add
  kOpUcPost,         // victim UC QP: SEND or WRITE
  kOpUdSend,         // victim UD QP: SEND to the peer's UD QP
  kOpXrcPost,        // victim XRC initiator: SEND / WRITE / READ to the peer's XRC SRQ
  kOpPostRecv,       // receives on a queue of the victim or the peer
  kOpPeerRc,         // the peer's RC QPs towards the victim: SEND, WRITE, READ, atomic
  kOpPeerOther,      // the peer's UC, UD and XRC QPs towards the victim
  kOpModifyQp,       // a victim QP to ERR, SQD, back to RTS, or through RESET to RTS again
  kOpCm,             // the victim's connection manager: DREQ, DREP, Destroy, REQ, RTU, REJ, SIDR_REQ, peer gone
  kOpMemory,         // the victim's memory: deregister / register again (rw, recv, dst), bind the window, invalidate it
  kOpPoll,           // poll every CQ and check the completions
  kOpDestroyQp,      // destroy a victim QP (packets for it keep arriving)
  kOpSrq,            // arm an SRQ's limit (IBV_EVENT_SRQ_LIMIT_REACHED), or resize it
  kOperationCount,
};

inline constexpr uint8_t kTimeMilliseconds = 0x01;  // time record selector: the u16 counts milliseconds
inline constexpr uint8_t kTimeStall = 0x02;         // time record selector: the clock jumps before anything moves

// The bench's numbers, for the corpus generator: every one is the same in every run (DeviceConfig::id_seed 0, a
// ManualClock), so captures written once stay valid.
struct LiveNumbers {
  uint32_t rc_qpn = 0, rc_on_srq_qpn = 0, uc_qpn = 0, ud_qpn = 0, xrc_target_qpn = 0, xrc_initiator_qpn = 0;
  uint32_t peer_rc_qpn = 0, peer_ud_qpn = 0, peer_xrc_initiator_qpn = 0;
  uint32_t xrc_srqn = 0;
  uint32_t ud_qkey = 0;
  // Expected PSNs at the victim after set-up: what its responders expect, what its requesters send next.
  uint32_t rc_rq_psn = 0, uc_rq_psn = 0, xrc_rq_psn = 0, rc_sq_psn = 0;
  uint32_t rkey[kMemoryCount] = {};
  uint64_t iova[kMemoryCount] = {};
  uint64_t length[kMemoryCount] = {};
  uint64_t victim_guid = 0, peer_guid = 0;
  uint64_t listen_service = 0;  // the service ID the victim listens on
  // The victim's connections after set-up (local comm ID at the victim, remote at the peer).
  uint32_t passive_established_local = 0, passive_established_remote = 0;
  uint32_t passive_rep_sent_local = 0, passive_rep_sent_remote = 0;
  uint32_t active_req_sent_local = 0, active_req_sent_remote = 0;  // remote: the peer's id, REQ_RCVD there
  uint32_t active_established_local = 0, active_established_remote = 0;
  uint32_t active_dreq_sent_local = 0, active_dreq_sent_remote = 0;
};
LiveNumbers DescribeBench();

// One record as the fuzzer reads it.
std::vector<uint8_t> Record(uint8_t flags, uint8_t selector, std::span<const uint8_t> bytes);

}  // namespace uroce::emu::fuzz
