// A Transport decorator that records every datagram sent and received through it in a pcap file, as full IPv4 or
// IPv6 + UDP packets (frame.h), so Wireshark, tshark and `uroce_decode` show the traffic exactly as a NIC would
// have seen it -- including an ICRC that verifies, because each frame is rebuilt with the flow the datagram had:
//   sent:     inner.OutgoingFlow(dst, src_port), the flow the sender sealed the ICRC for (transport.h);
//   received: src and dst from the InDatagram, and the IPv4 ID when the transport knew it. A UDP socket does not
//             expose the ID, and peers send changing ones (segment k of a UDP_SEGMENT run carries k; kernel rxe
//             counts): the ID recorded is then the one the ICRC was sealed for (RecoverIpId), 0 when none is, so
//             a packet good on the wire verifies in the capture and a corrupted one does not (2^-16 of corrupted
//             ones excepted: a 16-bit check).
// Capture never changes what the inner transport does: a failed pcap write is counted, not returned.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include "wire/clock.h"
#include "wire/pcap.h"
#include "wire/transport.h"

namespace uroce::wire {

class CaptureTransport final : public Transport {
 public:
  // `inner`, `writer` and `clock` must outlive this object. Record timestamps are clock.NowNs() plus
  // `timestamp_offset_ns`; the constructor without an offset uses WallClockOffsetNs(clock), so a capture taken on
  // the monotonic SystemClock shows wall-clock dates while its intervals follow `clock`.
  CaptureTransport(Transport& inner, PcapWriter& writer, const Clock& clock, int64_t timestamp_offset_ns);
  CaptureTransport(Transport& inner, PcapWriter& writer, const Clock& clock);
  // Same, owning the inner transport.
  CaptureTransport(std::unique_ptr<Transport> inner, PcapWriter& writer, const Clock& clock);

  // CLOCK_REALTIME minus clock.NowNs(), sampled now.
  static int64_t WallClockOffsetNs(const Clock& clock);

  UdpEndpoint local() const override { return inner_.local(); }
  Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t src_port) const override {
    return inner_.OutgoingFlow(dst, src_port);
  }
  // Sends through the inner transport, then records the datagrams it accepted (the first n of the batch).
  int Send(std::span<const OutDatagram> batch) override;
  // Records each received datagram before handing it to `handler`.
  int Poll(const DatagramHandler& handler, int64_t timeout_ns) override;
  void Wake() override { inner_.Wake(); }
  void SetReceiveArmed(bool armed) override { inner_.SetReceiveArmed(armed); }

  uint64_t captured() const { return captured_.load(std::memory_order_relaxed); }
  // Datagrams that could not be recorded (frame too large for IP, or the pcap write failed).
  uint64_t capture_errors() const { return capture_errors_.load(std::memory_order_relaxed); }
  // The last pcap write error (-errno), 0 if none.
  int last_error() const { return last_error_.load(std::memory_order_relaxed); }

 private:
  void Record(const Flow& flow, std::span<const uint8_t> udp_payload);

  std::unique_ptr<Transport> owned_;
  Transport& inner_;
  PcapWriter& writer_;
  const Clock& clock_;
  int64_t offset_ns_;
  std::atomic<uint64_t> captured_{0};
  std::atomic<uint64_t> capture_errors_{0};
  std::atomic<int> last_error_{0};
};

}  // namespace uroce::wire
