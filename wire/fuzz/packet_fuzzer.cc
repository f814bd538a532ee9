// libFuzzer target for the RoCEv2 codec: IP/UDP framing, packet parsing, ICRC, and encode/parse consistency.
// Build and run (clang): bazel build --config=fuzz //wire/fuzz:packet_fuzzer
//                        bazel-bin/wire/fuzz/packet_fuzzer -max_total_time=60 wire/fuzz/corpus
// The same entry point runs under the normal build in //wire/fuzz:packet_fuzzer_replay_test.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "wire/frame.h"
#include "wire/icrc.h"
#include "wire/packet.h"

namespace uroce::wire {
namespace {

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

// Re-encodes a parsed packet and checks the result against the original bytes.
void CheckReencode(const Flow& flow, std::span<const uint8_t> original, const PacketView& view,
                   const IcrcCheck& original_check) {
  PacketSpec spec = SpecFromView(view);
  const size_t len = EncodedLength(spec, view.payload.size());
  Check(len == original.size());
  std::vector<uint8_t> out(len);
  auto n = EncodePacket(spec, view.payload, out);
  Check(n.has_value() && *n == len);
  // Headers and payload identical; the pad is re-written as zeros and the ICRC as a placeholder.
  const size_t covered = len - kIcrcSize - view.pad.size();
  Check(std::memcmp(out.data(), original.data(), covered) == 0);
  SealIcrc(flow, out);
  Check(VerifyIcrc(flow, out).ok);
  bool zero_pad = true;
  for (uint8_t b : view.pad) zero_pad &= b == 0;
  if (original_check.ok && zero_pad) Check(std::memcmp(out.data(), original.data(), len) == 0);

  auto again = ParsePacket(out);
  Check(again.has_value());
  Check(again->info == view.info && again->payload.size() == view.payload.size());
}

}  // namespace
}  // namespace uroce::wire

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace uroce::wire;
  std::span<const uint8_t> input(data, size);

  // 1. The input as an IP packet.
  auto frame = ParseIpUdpFrame(input);
  if (frame.has_value()) {
    const auto& udp = frame->udp_payload;
    Check(udp.data() >= data && udp.data() + udp.size() <= data + size);
    const IcrcCheck check = VerifyIcrc(frame->flow, udp);
    const std::optional<uint16_t> id = RecoverIpId(frame->flow, udp);
    if (check.ok) Check(id.has_value() && *id == frame->flow.ip_id);
    auto view = ParsePacket(udp);
    if (view.has_value()) {
      Check(view->icrc == check.got);
      CheckReencode(frame->flow, udp, *view, check);
    }
    // Re-frame the UDP payload and parse it back.
    const bool v6 = !(frame->flow.src.addr.is_v4() && frame->flow.dst.addr.is_v4());
    std::vector<uint8_t> rebuilt(IpUdpFrameLength(v6, udp.size()));
    if (BuildIpUdpFrame(frame->flow, udp, rebuilt, frame->ttl, frame->tos) == rebuilt.size()) {
      auto back = ParseIpUdpFrame(rebuilt);
      Check(back.has_value());
      Check(back->flow.src == frame->flow.src && back->flow.dst == frame->flow.dst);
      Check(back->udp_payload.size() == udp.size());
    }
  }

  // 2. The input as a UDP payload (reaches the packet parser without a valid IP header).
  auto view = ParsePacket(input);
  if (view.has_value()) {
    Flow flow;
    flow.src = {IpAddress::V4(0x0A000001), 0xC000};
    flow.dst = {IpAddress::V4(0x0A000002), kRoceV2UdpPort};
    CheckReencode(flow, input, *view, VerifyIcrc(flow, input));
  }
  return 0;
}
