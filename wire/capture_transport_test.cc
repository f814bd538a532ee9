#include "wire/capture_transport.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "wire/frame.h"
#include "wire/icrc.h"
#include "wire/packet.h"

namespace uroce::wire {
namespace {

using Bytes = std::vector<uint8_t>;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

UdpEndpoint Endpoint(const char* ip, uint16_t port = kRoceV2UdpPort) {
  return UdpEndpoint{.addr = *IpAddress::Parse(ip), .port = port};
}

// A transport that sends nowhere: it remembers what it was given, accepts at most `accept` datagrams per Send (or
// fails with `send_error`), and delivers queued datagrams on Poll. Like a UDP socket, it sends every datagram from
// its bound port and a fixed IPv4 ID, whatever source port is asked for.
class FakeTransport final : public Transport {
 public:
  explicit FakeTransport(UdpEndpoint local) : local_(local) {}
  UdpEndpoint local() const override { return local_; }
  Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t src_port) const override {
    return Flow{.src = local_, .dst = dst, .ip_id = 0x1234};
  }
  int Send(std::span<const OutDatagram> batch) override {
    std::lock_guard lock(mu_);
    if (send_error != 0) return send_error;
    const size_t n = std::min(batch.size(), accept);
    for (size_t i = 0; i < n; ++i) sent.emplace_back(batch[i].payload.begin(), batch[i].payload.end());
    return static_cast<int>(n);
  }
  int Poll(const DatagramHandler& handler, int64_t timeout_ns) override {
    int delivered = 0;
    while (!incoming.empty()) {
      Incoming in = std::move(incoming.front());
      incoming.pop_front();
      handler(InDatagram{.src = in.src, .dst = local_, .payload = in.payload, .ip_id = in.ip_id});
      ++delivered;
    }
    return delivered;
  }
  void Wake() override {}

  struct Incoming {
    UdpEndpoint src;
    Bytes payload;
    std::optional<uint16_t> ip_id;
  };
  std::deque<Incoming> incoming;
  std::vector<Bytes> sent;
  size_t accept = SIZE_MAX;
  int send_error = 0;

 private:
  std::mutex mu_;
  UdpEndpoint local_;
};

// An RC SEND_ONLY packet with `payload_len` bytes, ICRC sealed for `flow`.
Bytes SendOnly(const Flow& flow, uint32_t qpn, uint32_t psn, size_t payload_len) {
  PacketSpec spec;
  spec.bth.opcode = opcode::kRcSendOnly;
  spec.bth.dest_qp = qpn;
  spec.bth.psn = psn;
  spec.bth.ack_req = true;
  Bytes payload(payload_len);
  for (size_t i = 0; i < payload_len; ++i) payload[i] = static_cast<uint8_t>(i);
  Bytes out(EncodedLength(spec, payload.size()));
  auto n = EncodePacket(spec, payload, out);
  EXPECT_TRUE(n.has_value());
  SealIcrc(flow, out);
  return out;
}

struct Captured {
  uint64_t timestamp_ns;
  Flow flow;
  Bytes udp_payload;
  bool icrc_ok;
};

std::vector<Captured> ReadCapture(const std::string& path) {
  std::vector<Captured> out;
  PcapReader reader;
  EXPECT_EQ(reader.Open(path), 0) << reader.error();
  PcapRecord record;
  int rc;
  while ((rc = reader.Next(&record)) == 1) {
    auto frame = ParseIpUdpFrame(record.ip_packet);
    EXPECT_TRUE(frame.has_value());
    if (!frame) continue;
    out.push_back({record.timestamp_ns, frame->flow, Bytes(frame->udp_payload.begin(), frame->udp_payload.end()),
                   VerifyIcrc(frame->flow, frame->udp_payload).ok});
  }
  EXPECT_EQ(rc, 0) << reader.error();
  return out;
}

TEST(CaptureTransport, RecordsSentAndReceivedDatagramsWithVerifyingIcrc) {
  const std::string path = TempPath("capture.pcap");
  PcapWriter writer;
  ASSERT_EQ(writer.Open(path), 0);
  ManualClock clock(1'000);
  FakeTransport inner(Endpoint("127.0.0.1"));
  CaptureTransport capture(inner, writer, clock, /*timestamp_offset_ns=*/5'000'000'000);

  const UdpEndpoint peer = Endpoint("127.0.0.2", 50000);
  const Flow out_flow = capture.OutgoingFlow(peer, 0xC123);
  const Bytes request = SendOnly(out_flow, 17, 100, 13);
  const OutDatagram out{.dst = peer, .src_port = 0xC123, .payload = request};
  ASSERT_EQ(capture.Send({&out, 1}), 1);
  EXPECT_EQ(inner.sent, std::vector<Bytes>{request});

  // A reply from the peer whose IPv4 ID the transport saw, and one whose ID it did not (a UDP socket).
  clock.Advance(250);
  const Flow in_flow{.src = peer, .dst = inner.local(), .ip_id = 0x4321};
  const Bytes reply = SendOnly(in_flow, 18, 200, 4);
  inner.incoming.push_back({peer, reply, 0x4321});
  const Flow in_flow_no_id{.src = peer, .dst = inner.local(), .ip_id = 0};
  const Bytes reply_no_id = SendOnly(in_flow_no_id, 18, 201, 0);
  inner.incoming.push_back({peer, reply_no_id, std::nullopt});
  std::vector<Bytes> handled;
  ASSERT_EQ(capture.Poll([&](const InDatagram& d) { handled.emplace_back(d.payload.begin(), d.payload.end()); }, 0),
            2);
  EXPECT_EQ(handled, (std::vector<Bytes>{reply, reply_no_id}));
  EXPECT_EQ(capture.captured(), 3u);
  EXPECT_EQ(capture.capture_errors(), 0u);
  ASSERT_EQ(writer.Close(), 0);

  const std::vector<Captured> records = ReadCapture(path);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].timestamp_ns, 5'000'001'000u);
  EXPECT_EQ(records[0].flow.src, inner.local());
  EXPECT_EQ(records[0].flow.dst, peer);
  EXPECT_EQ(records[0].flow.ip_id, 0x1234);  // the flow the inner transport really sends with
  EXPECT_EQ(records[0].udp_payload, request);
  EXPECT_TRUE(records[0].icrc_ok);

  EXPECT_EQ(records[1].timestamp_ns, 5'000'001'250u);
  EXPECT_EQ(records[1].flow.src, peer);
  EXPECT_EQ(records[1].flow.dst, inner.local());
  EXPECT_EQ(records[1].flow.ip_id, 0x4321);
  EXPECT_EQ(records[1].udp_payload, reply);
  EXPECT_TRUE(records[1].icrc_ok);

  EXPECT_EQ(records[2].flow.ip_id, 0);
  EXPECT_TRUE(records[2].icrc_ok);
}

// A UDP socket does not show the IPv4 ID, and segment k of a peer's UDP_SEGMENT run carries ID k (its ICRC sealed for
// it): the capture records the ID the ICRC was sealed for, so the packet verifies there as it did on the wire; a
// corrupted one is recorded with ID 0 and shows as bad.
TEST(CaptureTransport, ReceivedPacketsWithoutAnIdAreRecordedWithTheIdTheirIcrcWasSealedFor) {
  const std::string path = TempPath("capture-ids.pcap");
  PcapWriter writer;
  ASSERT_EQ(writer.Open(path), 0);
  ManualClock clock(1'000);
  FakeTransport inner(Endpoint("127.0.0.1"));
  CaptureTransport capture(inner, writer, clock, 0);
  const UdpEndpoint peer = Endpoint("127.0.0.2", 4791);
  const Bytes third_segment = SendOnly(Flow{.src = peer, .dst = inner.local(), .ip_id = 3}, 18, 300, 64);
  Bytes corrupted = SendOnly(Flow{.src = peer, .dst = inner.local(), .ip_id = 0}, 18, 301, 64);
  corrupted[20] ^= 0x5a;
  inner.incoming.push_back({peer, third_segment, std::nullopt});
  inner.incoming.push_back({peer, corrupted, std::nullopt});
  ASSERT_EQ(capture.Poll([](const InDatagram&) {}, 0), 2);
  ASSERT_EQ(writer.Close(), 0);
  const std::vector<Captured> records = ReadCapture(path);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].flow.ip_id, 3);
  EXPECT_TRUE(records[0].icrc_ok);
  EXPECT_FALSE(records[1].icrc_ok);
}

TEST(CaptureTransport, RecordsOnlyWhatTheInnerTransportAccepted) {
  const std::string path = TempPath("capture_partial.pcap");
  PcapWriter writer;
  ASSERT_EQ(writer.Open(path), 0);
  ManualClock clock;
  FakeTransport inner(Endpoint("::1"));
  CaptureTransport capture(inner, writer, clock, 0);
  const UdpEndpoint peer = Endpoint("::1", 40000);
  const Flow flow = capture.OutgoingFlow(peer, 0);
  const Bytes a = SendOnly(flow, 1, 1, 8);
  const Bytes b = SendOnly(flow, 1, 2, 8);
  const OutDatagram batch[] = {{.dst = peer, .payload = a}, {.dst = peer, .payload = b}};

  inner.accept = 1;
  EXPECT_EQ(capture.Send(batch), 1);
  inner.send_error = -ENOBUFS;
  EXPECT_EQ(capture.Send(batch), -ENOBUFS);
  ASSERT_EQ(writer.Close(), 0);

  const std::vector<Captured> records = ReadCapture(path);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].udp_payload, a);
  EXPECT_TRUE(records[0].icrc_ok);  // IPv6 frame, ICRC over the IPv6 pseudo-header
}

TEST(CaptureTransport, AFailedPcapWriteIsCountedNotReturned) {
  PcapWriter writer;  // never opened: every Write fails with -EBADF
  ManualClock clock;
  FakeTransport inner(Endpoint("127.0.0.1"));
  CaptureTransport capture(inner, writer, clock, 0);
  const UdpEndpoint peer = Endpoint("127.0.0.2");
  const Bytes a = SendOnly(capture.OutgoingFlow(peer, 0), 1, 1, 8);
  const OutDatagram out{.dst = peer, .payload = a};
  EXPECT_EQ(capture.Send({&out, 1}), 1);
  EXPECT_EQ(inner.sent.size(), 1u);
  EXPECT_EQ(capture.captured(), 0u);
  EXPECT_EQ(capture.capture_errors(), 1u);
  EXPECT_EQ(capture.last_error(), -EBADF);
}

TEST(CaptureTransport, WallClockOffsetMakesMonotonicTimeADate) {
  const int64_t offset = CaptureTransport::WallClockOffsetNs(SystemClock::Instance());
  const uint64_t now = SystemClock::Instance().NowNs() + static_cast<uint64_t>(offset);
  EXPECT_GT(now, 1'600'000'000ull * 1'000'000'000);  // after September 2020
}

TEST(CaptureTransport, ConcurrentSendersProduceAReadableCapture) {
  const std::string path = TempPath("capture_threads.pcap");
  PcapWriter writer;
  ASSERT_EQ(writer.Open(path), 0);
  CaptureTransport capture(std::make_unique<FakeTransport>(Endpoint("127.0.0.1")), writer,
                           SystemClock::Instance());
  const UdpEndpoint peer = Endpoint("127.0.0.2");
  constexpr int kThreads = 3;
  constexpr int kPerThread = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const Bytes packet = SendOnly(capture.OutgoingFlow(peer, 0), 100 + t, 0, 64);
      const OutDatagram out{.dst = peer, .payload = packet};
      for (int i = 0; i < kPerThread; ++i) ASSERT_EQ(capture.Send({&out, 1}), 1);
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_EQ(writer.Close(), 0);
  const std::vector<Captured> records = ReadCapture(path);
  ASSERT_EQ(records.size(), size_t{kThreads * kPerThread});
  for (const Captured& r : records) EXPECT_TRUE(r.icrc_ok);
}

}  // namespace
}  // namespace uroce::wire
