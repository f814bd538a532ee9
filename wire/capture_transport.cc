#include "wire/capture_transport.h"

#include "wire/scratch_list.h"

#include <time.h>

#include <cerrno>
#include <vector>

#include "wire/frame.h"
#include "wire/icrc.h"

namespace uroce::wire {

CaptureTransport::CaptureTransport(Transport& inner, PcapWriter& writer, const Clock& clock,
                                   int64_t timestamp_offset_ns)
    : inner_(inner), writer_(writer), clock_(clock), offset_ns_(timestamp_offset_ns) {}

CaptureTransport::CaptureTransport(Transport& inner, PcapWriter& writer, const Clock& clock)
    : CaptureTransport(inner, writer, clock, WallClockOffsetNs(clock)) {}

CaptureTransport::CaptureTransport(std::unique_ptr<Transport> inner, PcapWriter& writer, const Clock& clock)
    : owned_(std::move(inner)),
      inner_(*owned_),
      writer_(writer),
      clock_(clock),
      offset_ns_(WallClockOffsetNs(clock)) {}

int64_t CaptureTransport::WallClockOffsetNs(const Clock& clock) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const int64_t realtime = int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
  return realtime - static_cast<int64_t>(clock.NowNs());
}

void CaptureTransport::Record(const Flow& flow, std::span<const uint8_t> udp_payload) {
  // One buffer per thread: Send may run on several threads at once (and from the engine's exit handler), and a
  // frame is at most 64 KiB + headers.
  ScratchList<uint8_t> scratch;
  std::vector<uint8_t>& frame = *scratch;
  const bool v6 = !(flow.src.addr.is_v4() && flow.dst.addr.is_v4());
  frame.resize(IpUdpFrameLength(v6, udp_payload.size()));
  const size_t length = BuildIpUdpFrame(flow, udp_payload, frame);
  if (length == 0) {
    capture_errors_.fetch_add(1, std::memory_order_relaxed);
    last_error_.store(-EMSGSIZE, std::memory_order_relaxed);
    return;
  }
  const uint64_t timestamp = clock_.NowNs() + static_cast<uint64_t>(offset_ns_);
  if (int err = writer_.Write(timestamp, std::span<const uint8_t>(frame.data(), length)); err < 0) {
    capture_errors_.fetch_add(1, std::memory_order_relaxed);
    last_error_.store(err, std::memory_order_relaxed);
    return;
  }
  captured_.fetch_add(1, std::memory_order_relaxed);
}

int CaptureTransport::Send(std::span<const OutDatagram> batch) {
  const int sent = inner_.Send(batch);
  for (int i = 0; i < sent && static_cast<size_t>(i) < batch.size(); ++i) {
    const OutDatagram& datagram = batch[i];
    Record(OutgoingFlowFrom(inner_, datagram.src_addr, datagram.dst, datagram.src_port), datagram.payload);
  }
  return sent;
}

int CaptureTransport::Poll(const DatagramHandler& handler, int64_t timeout_ns) {
  return inner_.Poll(
      [this, &handler](const InDatagram& datagram) {
        Flow flow{.src = datagram.src, .dst = datagram.dst, .ip_id = datagram.ip_id.value_or(0)};
        if (!datagram.ip_id && datagram.src.addr.is_v4()) {
          // A UDP socket does not show the IPv4 Identification; the one the ICRC was sealed for is the one the packet
          // carried (segment k of a UDP_SEGMENT run: k; kernel rxe: its counter).
          if (const std::optional<uint16_t> id = RecoverIpId(flow, datagram.payload)) flow.ip_id = *id;
        }
        Record(flow, datagram.payload);
        handler(datagram);
      },
      timeout_ns);
}

}  // namespace uroce::wire
