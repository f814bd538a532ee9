// What `uroce_decode` prints for each packet of a capture: one line of text or one JSON object per RoCEv2 packet,
// with every BTH field and every extension header the opcode carries, and whether the ICRC verifies.
//
// Text (one line per packet; extension headers only when the opcode has them; FECN/BECN only when set):
//   #1 1700000000.000000100 127.0.0.1:49152 > 127.0.0.2:4791 RC_RDMA_WRITE_FIRST qp=0x000011 psn=0x000064 se=0
//      mig=0 ackreq=0 pad=0 pkey=0xffff reth{va=0x1000 rkey=0x1234 len=4096} payload=1024 icrc=ok
//   #2 ... RC_ACKNOWLEDGE qp=0x000012 psn=0x000064 ... aeth{NAK remote access error (code 2) msn=7} payload=0
//      icrc=bad (got 0x00000000, want 0x1a2b3c4d)
//   #3 1700000000.000000300 127.0.0.1:49152 > 127.0.0.2:4791 malformed: packet truncated
// JSON (one object per line): index, ts (seconds, 9 decimals), ts_ns, src, dst, opcode, opcode_name, transport,
// dest_qp, psn, se, mig_req, ack_req, pad, pkey, tver, fecn, becn, then per extension header rdeth{eecn},
// deth{qkey, src_qp}, xrceth{srqn}, reth{va, rkey, len}, atomiceth{va, rkey, swap_add, compare},
// aeth{syndrome, kind, credits | rnr_timer + rnr_timer_us | nak_code + nak, msn}, atomicacketh{original}, imm,
// ieth{rkey}; then payload_len, icrc (carried), icrc_want (computed), icrc_ok. A malformed packet is
// {"index", "ts", "ts_ns", ["src", "dst",] "malformed": reason}. 64-bit values are plain JSON numbers.
//
// CM MADs (wire/cm_mad.h): a UD packet to QP1 whose payload has the CM management class (0x07) is named by its
// message at the end of the line, with the cma_hdr of a REQ or SIDR_REQ when its private data has one:
//   ... payload=256 icrc=ok CM REQ comm=0x1234abcd sid=0x0000000001061c06 qpn=0x11 psn=0xabcdef
//      cma 127.0.0.2:45678->127.0.0.1
//   REP comm remote qpn [eecn, when not 0: an XRC target's QPN] psn; RTU, DREP comm remote; DREQ comm remote
//   remote_qpn; MRA comm remote timeout; REJ comm remote reason=8 (INVALID_SERVICE_ID); SIDR_REQ req sid [cma];
//   SIDR_REP req status=1 (UNSUPPORTED) qpn qkey. A MAD the kernel would drop ends in "CM malformed: <why>".
// In JSON the same fields are an object "cm": {"message": "REQ", "comm", "sid", "qpn", "psn", "cma": {"src",
// "src_port", "dst"}}, a named number followed by "<key>_name" ("reason_name", "status_name"); or
// "cm": {"malformed": why}. Every other packet prints as before.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "wire/pcap.h"

namespace uroce::tools {

enum class DecodeFormat { kText, kJson };

struct DecodeCounts {
  uint64_t packets = 0;    // records read
  uint64_t roce = 0;       // RoCEv2 packets decoded (ICRC good or bad)
  uint64_t skipped = 0;    // not RoCEv2: not IP, not UDP, UDP to another port
  uint64_t malformed = 0;  // broken link/IP/UDP/BTH structure, cut by snaplen, or a file cut short
  uint64_t icrc_bad = 0;   // RoCEv2 packets whose ICRC does not match
};

// Decodes records one at a time and counts what it saw.
class PacketDecoder {
 public:
  explicit PacketDecoder(DecodeFormat format) : format_(format) {}

  // The line for a record (no trailing newline), or nullopt when the record is skipped as not RoCEv2.
  std::optional<std::string> Decode(const wire::PcapRecord& record);
  // Same, from the parts of a record: an IP packet (link header stripped) captured at `timestamp_ns`.
  // `original_length` is the length on the wire when the capture cut the packet (snaplen), else 0.
  std::optional<std::string> DecodeIp(uint64_t index, uint64_t timestamp_ns, std::span<const uint8_t> ip_packet,
                                      uint32_t original_length = 0);

  // The line for a file-level problem met at record `index` (the file cut short): counted as malformed.
  std::string FileError(uint64_t index, const std::string& message);

  // "N packets, N RoCE, N skipped (not RoCEv2), N malformed, N ICRC bad".
  std::string Summary() const;
  const DecodeCounts& counts() const { return counts_; }

 private:
  std::string Malformed(uint64_t index, uint64_t timestamp_ns, const std::string* src, const std::string* dst,
                        const std::string& reason);

  DecodeFormat format_;
  DecodeCounts counts_;
};

// "1700000000.000000100": seconds and nanoseconds.
std::string FormatTimestamp(uint64_t timestamp_ns);
// `text` as a JSON string literal, quotes included.
std::string JsonString(const std::string& text);

}  // namespace uroce::tools
