#include "service/device_service.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <variant>
#include <vector>

#include "wire/cm_mad.h"
#include "wire/headers.h"
#include "wire/packet.h"
#include "wire/packet_ring.h"
#include "wire/udp_socket.h"
#include "wire/unix_socket.h"

namespace uroce::service {
namespace {

// A process of the host device, as the library is one (verbs_api/host_device.cc), reduced to its sockets.
struct FakeProcess {
  int control = -1;
  int forward = -1;  // our end of the pair the service forwards on
  int steered = -1;  // the UDP socket the welcome brought, when the service has the kernel steer
  uint8_t owner = 0;

  ~FakeProcess() { Close(); }
  void Close() {
    for (int fd : {control, forward, steered}) {
      if (fd >= 0) close(fd);
    }
    control = forward = steered = -1;
  }

  // Joins; returns the kWelcome's status.
  int Join(const wire::IpAddress& address) {
    sockaddr_un sun;
    const socklen_t len = wire::AbstractUnixAddress(wire::DeviceServiceName(address), &sun);
    control = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (connect(control, reinterpret_cast<sockaddr*>(&sun), len) < 0) return errno;
    int pair[2];
    socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, pair);
    forward = pair[0];
    EXPECT_EQ(wire::SendControl(control, {wire::ControlType::kHello, 0, uint64_t(getpid())}, pair[1]), 0);
    close(pair[1]);
    wire::ControlMessage welcome;
    std::vector<int> fds;
    EXPECT_EQ(wire::ReceiveControl(control, 5000, &welcome, &fds), 0);
    if (fds.size() == 1) steered = fds[0];
    EXPECT_EQ(welcome.type, wire::ControlType::kWelcome);
    owner = uint8_t(welcome.value);
    return welcome.status;
  }

  wire::ControlMessage Receive() {
    wire::ControlMessage m;
    EXPECT_EQ(wire::ReceiveControl(control, 5000, &m), 0);
    return m;
  }

  int Request(wire::ControlType type, uint64_t value) {
    EXPECT_EQ(wire::SendControl(control, {type, 0, value}), 0);
    return Receive().status;
  }

  // The next forwarded datagram's payload (empty after 5 s).
  std::vector<uint8_t> NextForwarded(wire::ForwardHeader* header = nullptr) {
    pollfd p{forward, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) return {};
    std::vector<uint8_t> bytes(10000);
    const ssize_t n = recv(forward, bytes.data(), bytes.size(), 0);
    bytes.resize(size_t(n > 0 ? n : 0));
    auto h = wire::ForwardHeader::Decode(bytes);
    EXPECT_TRUE(h);
    if (h && header) *header = *h;
    return std::vector<uint8_t>(bytes.begin() + std::min(bytes.size(), wire::ForwardHeader::kSize), bytes.end());
  }
  bool NothingForwarded() {
    uint8_t b[16];
    return recv(forward, b, sizeof b, MSG_DONTWAIT) < 0 && errno == EAGAIN;
  }
  // The next datagram the kernel steered to our own socket (empty after `wait_ms`).
  std::vector<uint8_t> NextSteered(int wait_ms = 5000) {
    pollfd p{steered, POLLIN, 0};
    if (steered < 0 || poll(&p, 1, wait_ms) != 1) return {};
    std::vector<uint8_t> bytes(10000);
    const ssize_t n = recv(steered, bytes.data(), bytes.size(), 0);
    bytes.resize(size_t(n > 0 ? n : 0));
    return bytes;
  }
};

std::vector<uint8_t> DataPacket(uint32_t dest_qp, uint8_t tag) {
  std::vector<uint8_t> p(wire::Bth::kSize + 8, tag);
  wire::Bth bth;
  bth.opcode = 0x04;
  bth.dest_qp = dest_qp;
  bth.Encode(p.data());
  return p;
}

// A MAD's packet (its ICRC left zero: the service does not check it).
std::vector<uint8_t> MadPacket(const wire::CmMad& mad) {
  std::vector<uint8_t> p(wire::Bth::kSize + wire::Deth::kSize);
  wire::Bth bth;
  bth.opcode = 0x64;
  bth.dest_qp = wire::kGsiQpn;
  bth.Encode(p.data());
  const auto bytes = wire::EncodeCmMad(mad);
  p.insert(p.end(), bytes.begin(), bytes.end());
  p.resize(p.size() + 4);
  return p;
}

std::vector<uint8_t> ReqPacket(uint64_t service_id, uint32_t comm_id = 0x01020304) {
  wire::CmReq req;
  req.local_comm_id = comm_id;
  req.service_id = service_id;
  return MadPacket(wire::CmMad{1, 0, req});
}

// The CM MAD a forwarded packet carries (nullopt: none).
std::optional<wire::CmMad> MadOf(const std::vector<uint8_t>& packet) {
  auto view = wire::ParsePacket(packet);
  if (!view || view.value().bth.dest_qp != wire::kGsiQpn) return std::nullopt;
  auto mad = wire::ParseCmMad(view.value().payload);
  if (!mad) return std::nullopt;
  return mad.value();
}

class DeviceServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // An address of our own (tests run in parallel) and the port the kernel gives a probe socket.
    std::random_device rd;
    address_ = wire::IpAddress::V4(0x7f000000u | (200u + rd() % 50) << 16 | (rd() % 250 + 1) << 8 | (rd() % 250 + 1));
    wire::UdpEndpoint probe_local;
    const int probe = wire::OpenRoceUdpSocket({address_, 0}, 0, &probe_local);
    ASSERT_GE(probe, 0);
    close(probe);
    port_ = probe_local.port;
    service_ = std::make_unique<DeviceService>(io_, address_, port_, std::chrono::milliseconds(60'000), max_processes_);
    ASSERT_EQ(service_->Start(), 0);
    thread_ = std::thread([this] { service_->Run(); });
    sender_ = wire::OpenRoceUdpSocket({address_, 0}, 0, &sender_local_);
    ASSERT_GE(sender_, 0);
  }
  void TearDown() override {
    io_.stop();
    if (thread_.joinable()) thread_.join();
    if (sender_ >= 0) close(sender_);
  }
  void SendToService(const std::vector<uint8_t>& packet) {
    sockaddr_storage sa;
    socklen_t len;
    wire::ToSockaddr({address_, port_}, AF_INET, &sa, &len);
    ASSERT_EQ(sendto(sender_, packet.data(), packet.size(), 0, reinterpret_cast<sockaddr*>(&sa), len),
              ssize_t(packet.size()));
  }

  boost::asio::io_context io_;
  wire::IpAddress address_;
  uint16_t port_ = 0;
  std::unique_ptr<DeviceService> service_;
  std::thread thread_;
  int sender_ = -1;
  wire::UdpEndpoint sender_local_;
  unsigned max_processes_ = wire::kMaxOwners;  // before SetUp: a fixture that limits them sets it
};

// A service that admits two processes: the third gets EUSERS, as when the owner numbers run out (the library then says
// why, and by default takes a device of its own); once one leaves, a newcomer is admitted again.
class TwoProcessDeviceServiceTest : public DeviceServiceTest {
 protected:
  TwoProcessDeviceServiceTest() { max_processes_ = 2; }
};

TEST_F(TwoProcessDeviceServiceTest, AThirdProcessIsRefusedUntilOneLeaves) {
  FakeProcess a, b, c, d;
  ASSERT_EQ(a.Join(address_), 0);
  ASSERT_EQ(b.Join(address_), 0);
  EXPECT_EQ(c.Join(address_), EUSERS);
  EXPECT_EQ(c.owner, 0);
  a.Close();
  // The service sees a's hang-up in its own time: a join races it, so wait for a welcome.
  int status = EUSERS;
  for (int tries = 0; tries < 200 && status == EUSERS; ++tries) {
    d.Close();
    status = d.Join(address_);
    if (status == EUSERS) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(status, 0);
  EXPECT_NE(d.owner, 0);
  EXPECT_NE(d.owner, b.owner);
}

TEST_F(DeviceServiceTest, EachPacketReachesTheProcessThatOwnsItsDestination) {
  FakeProcess a, b;
  ASSERT_EQ(a.Join(address_), 0);
  ASSERT_EQ(b.Join(address_), 0);
  EXPECT_NE(a.owner, 0);
  EXPECT_NE(a.owner, b.owner);

  SendToService(DataPacket(wire::WithOwner24(b.owner, 0x11), 0xb1));
  SendToService(DataPacket(wire::WithOwner24(a.owner, 0x12), 0xa1));
  wire::ForwardHeader h;
  EXPECT_EQ(b.NextForwarded(&h), DataPacket(wire::WithOwner24(b.owner, 0x11), 0xb1));
  EXPECT_EQ(h.src, sender_local_);  // what the ICRC covers and a UD receive reports
  EXPECT_EQ(h.dst, (wire::UdpEndpoint{address_, port_}));
  EXPECT_EQ(a.NextForwarded(), DataPacket(wire::WithOwner24(a.owner, 0x12), 0xa1));
  EXPECT_TRUE(b.NothingForwarded());
}

TEST_F(DeviceServiceTest, NewConnectionsGoToTheListenerAndServiceIdsAreExclusive) {
  FakeProcess a, b;
  ASSERT_EQ(a.Join(address_), 0);
  ASSERT_EQ(b.Join(address_), 0);
  const uint64_t sid = wire::ServiceIdOf(wire::kPortSpaceTcp, 7471);
  SendToService(ReqPacket(sid, wire::WithOwner32(a.owner, 4)));  // nobody listens: refused (the next test)
  ASSERT_TRUE(MadOf(a.NextForwarded()));
  EXPECT_EQ(b.Request(wire::ControlType::kListen, sid), 0);
  EXPECT_EQ(a.Request(wire::ControlType::kListen, sid), EADDRINUSE);
  SendToService(ReqPacket(sid));
  EXPECT_EQ(b.NextForwarded(), ReqPacket(sid));  // the second: the first met no listener
  EXPECT_TRUE(b.NothingForwarded());
  EXPECT_TRUE(a.NothingForwarded());
  EXPECT_EQ(b.Request(wire::ControlType::kUnlisten, sid), 0);
  EXPECT_EQ(a.Request(wire::ControlType::kListen, sid), 0);
  SendToService(ReqPacket(sid));
  EXPECT_EQ(a.NextForwarded(), ReqPacket(sid));
}

// A REQ or SIDR_REQ for a service ID nobody listens on is answered as the kernel's CM answers it (REJ "invalid
// service ID", SIDR_REP "unsupported"), sent back to the requester's device: ours, whose socket's answer comes back to
// the service and goes on to the requesting process by its comm ID.
TEST_F(DeviceServiceTest, ARequestNobodyListensForIsRefusedAsTheKernelsCmRefusesIt) {
  FakeProcess a, b;
  ASSERT_EQ(a.Join(address_), 0);
  ASSERT_EQ(b.Join(address_), 0);
  const uint64_t sid = wire::ServiceIdOf(wire::kPortSpaceTcp, 7472);
  wire::CmReq req;
  req.local_comm_id = wire::WithOwner32(a.owner, 0x123456);
  req.service_id = sid;
  SendToService(MadPacket(wire::CmMad{0xabc, 0, req}));
  wire::ForwardHeader h;
  auto rej = MadOf(a.NextForwarded(&h));
  ASSERT_TRUE(rej);
  EXPECT_EQ(rej->transaction_id, 0xabcu);
  const auto* r = std::get_if<wire::CmRej>(&rej->message);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->remote_comm_id, req.local_comm_id);
  EXPECT_EQ(r->local_comm_id, 0u);
  EXPECT_EQ(r->message_rejected, wire::CmMessageRef::kReq);
  EXPECT_EQ(r->reason, static_cast<uint16_t>(wire::CmRejectReason::kInvalidServiceId));
  EXPECT_EQ(h.src, (wire::UdpEndpoint{address_, port_}));  // from the device, as a CM's answer comes

  wire::CmSidrReq sidr;
  sidr.request_id = wire::WithOwner32(b.owner, 0x42);
  sidr.service_id = wire::ServiceIdOf(wire::kPortSpaceUdp, 7472);
  SendToService(MadPacket(wire::CmMad{0xdef, 0, sidr}));
  auto rep = MadOf(b.NextForwarded());
  ASSERT_TRUE(rep);
  EXPECT_EQ(rep->transaction_id, 0xdefu);
  const auto* s = std::get_if<wire::CmSidrRep>(&rep->message);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->request_id, sidr.request_id);
  EXPECT_EQ(s->status, wire::SidrStatus::kUnsupported);
  EXPECT_TRUE(a.NothingForwarded());

  // Only requests are answered: a REP for a comm ID nobody owns is dropped in silence.
  wire::CmRep unmatched;
  unmatched.remote_comm_id = wire::WithOwner32(0xfe, 1);
  SendToService(MadPacket(wire::CmMad{1, 0, unmatched}));
  SendToService(DataPacket(wire::WithOwner24(a.owner, 0x11), 0xa2));  // the order stays: this comes next
  EXPECT_EQ(a.NextForwarded(), DataPacket(wire::WithOwner24(a.owner, 0x11), 0xa2));
  EXPECT_TRUE(b.NothingForwarded());
}

TEST_F(DeviceServiceTest, ADeadProcessLosesItsRoutesAndItsNumberIsNotReusedAtOnce) {
  FakeProcess a, b, c;
  ASSERT_EQ(a.Join(address_), 0);
  ASSERT_EQ(b.Join(address_), 0);
  const uint8_t dead = b.owner;
  const uint64_t sid = wire::ServiceIdOf(wire::kPortSpaceTcp, 9999);
  ASSERT_EQ(b.Request(wire::ControlType::kListen, sid), 0);
  b.Close();  // as at the process's death: the kernel closes its sockets
  // Once the service has seen it go, its service ID is free again, and its number is not handed out next.
  for (int i = 0; i < 500 && a.Request(wire::ControlType::kListen, sid) != 0; ++i) usleep(1000);
  ASSERT_EQ(c.Join(address_), 0);
  EXPECT_NE(c.owner, dead);
  SendToService(DataPacket(wire::WithOwner24(dead, 0x11), 1));  // a late packet for the dead: dropped
  SendToService(DataPacket(wire::WithOwner24(c.owner, 0x11), 2));
  EXPECT_EQ(c.NextForwarded(), DataPacket(wire::WithOwner24(c.owner, 0x11), 2));
  EXPECT_TRUE(a.NothingForwarded());
}

// The number of a process that left, taken over by one holding the XRC target QPs it handed over: its packets go
// there until that process leaves too; a live process's number is not to be had (EAGAIN until it leaves), nor one
// taken already (EALREADY), nor our own or 0 (EINVAL); and a newcomer never gets it while it is taken.
TEST_F(DeviceServiceTest, AGoneProcesssNumberIsTakenOverByOneProcess) {
  FakeProcess a, b, c;
  ASSERT_EQ(a.Join(address_), 0);
  ASSERT_EQ(b.Join(address_), 0);
  ASSERT_EQ(c.Join(address_), 0);
  const uint8_t gone = b.owner;
  EXPECT_EQ(a.Request(wire::ControlType::kAdoptOwner, gone), EAGAIN);  // it is still there
  EXPECT_EQ(a.Request(wire::ControlType::kAdoptOwner, a.owner), EINVAL);
  EXPECT_EQ(a.Request(wire::ControlType::kAdoptOwner, 0), EINVAL);
  b.Close();
  int rc = EAGAIN;
  for (int i = 0; i < 500 && (rc = a.Request(wire::ControlType::kAdoptOwner, gone)) == EAGAIN; ++i) usleep(1000);
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(a.Request(wire::ControlType::kAdoptOwner, gone), 0);  // ours already
  EXPECT_EQ(c.Request(wire::ControlType::kAdoptOwner, gone), EALREADY);
  SendToService(DataPacket(wire::WithOwner24(gone, 0x11), 7));
  EXPECT_EQ(a.NextForwarded(), DataPacket(wire::WithOwner24(gone, 0x11), 7));
  EXPECT_TRUE(c.NothingForwarded());
  // Newcomers get other numbers, whichever comes round.
  for (int i = 0; i < 3; ++i) {
    FakeProcess n;
    ASSERT_EQ(n.Join(address_), 0);
    EXPECT_NE(n.owner, gone);
  }
  a.Close();  // its own number and the one it took over go with it
  for (int i = 0; i < 500 && (rc = c.Request(wire::ControlType::kAdoptOwner, gone)) != 0; ++i) usleep(1000);
  EXPECT_EQ(rc, 0);
}

TEST_F(DeviceServiceTest, GarbageGetsAnErrorAndTheServiceServesOn) {
  FakeProcess stranger;
  ASSERT_EQ(stranger.Join(address_), 0);
  const uint8_t garbage[] = {1, 2, 3};
  send(stranger.control, garbage, sizeof garbage, MSG_NOSIGNAL);
  EXPECT_EQ(stranger.Receive().status, EINVAL);
  EXPECT_EQ(stranger.Request(wire::ControlType::kWelcome, 0), EINVAL);  // a service's message, not a process's
  FakeProcess second_hello = {};
  ASSERT_EQ(second_hello.Join(address_), 0);
  EXPECT_EQ(second_hello.Request(wire::ControlType::kHello, 0), EINVAL);  // no socket, and joined already
  SendToService(DataPacket(wire::WithOwner24(stranger.owner, 0x11), 3));
  EXPECT_EQ(stranger.NextForwarded(), DataPacket(wire::WithOwner24(stranger.owner, 0x11), 3));
}

TEST_F(DeviceServiceTest, AProcessThatOffersARingGetsItsPacketsThereRunsSplitIntoDatagrams) {
  FakeProcess a;
  ASSERT_EQ(a.Join(address_), 0);
  SendToService(DataPacket(wire::WithOwner24(a.owner, 0x11), 1));
  EXPECT_EQ(a.NextForwarded(), DataPacket(wire::WithOwner24(a.owner, 0x11), 1));  // before the offer: the socket

  std::unique_ptr<wire::PacketRing> ring;
  int ring_fd = -1;
  ASSERT_EQ(wire::PacketRing::Create(size_t{1} << 20, &ring, &ring_fd), 0);
  const int doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ASSERT_GE(doorbell, 0);
  const int not_a_ring = eventfd(0, EFD_CLOEXEC);
  const int bad[2] = {not_a_ring, doorbell};
  ASSERT_EQ(wire::SendControl(a.control, {wire::ControlType::kRingOffer, 0, 0}, bad), 0);
  EXPECT_EQ(a.Receive().status, EINVAL) << "an eventfd is no ring";
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const int pipe_bell[2] = {ring_fd, pipe_fds[1]};
  ASSERT_EQ(wire::SendControl(a.control, {wire::ControlType::kRingOffer, 0, ring->data_bytes()}, pipe_bell), 0);
  EXPECT_EQ(a.Receive().status, EINVAL) << "a pipe as doorbell could block the service once full";
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  const int offer[2] = {ring_fd, doorbell};
  ASSERT_EQ(wire::SendControl(a.control, {wire::ControlType::kRingOffer, 0, ring->data_bytes()}, offer), 0);
  EXPECT_EQ(a.Receive().status, 0);
  close(ring_fd);
  close(not_a_ring);

  // One UDP_SEGMENT send of three 1 KiB datagrams (as a peer host's engine sends a run), then a single one; the
  // process sleeps meanwhile, so the service rings its doorbell.
  ring->SetSleeping(true);
  std::vector<uint8_t> run;
  for (uint8_t tag = 2; tag <= 4; ++tag) {
    auto packet = DataPacket(wire::WithOwner24(a.owner, 0x11), tag);
    packet.resize(1024, tag);
    run.insert(run.end(), packet.begin(), packet.end());
  }
  bool gso = false, gro = false;
  wire::EnableUdpOffloads(sender_, &gso, &gro);
  if (!gso) GTEST_SKIP() << "this kernel has no UDP_SEGMENT (Linux 4.18)";
  sockaddr_storage sa;
  socklen_t len;
  wire::ToSockaddr({address_, port_}, AF_INET, &sa, &len);
  iovec iov{run.data(), run.size()};
  msghdr msg{};
  msg.msg_name = &sa;
  msg.msg_namelen = len;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) uint8_t control[wire::kUdpSegmentControlBytes];
  if (gso) wire::SetUdpSegmentControl(&msg, control, 1024);
  ASSERT_EQ(sendmsg(sender_, &msg, 0), ssize_t(run.size()));
  SendToService(DataPacket(wire::WithOwner24(a.owner, 0x11), 5));
  pollfd p{doorbell, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1) << "the service rings a sleeping process's doorbell";
  ring->SetSleeping(false);
  std::vector<uint8_t> tags;
  for (int i = 0; i < 500 && tags.size() < 4; ++i) {
    ring->Drain(16, [&](std::span<const uint8_t> record) {
      auto h = wire::ForwardHeader::Decode(record);
      ASSERT_TRUE(h);
      EXPECT_EQ(h->src, sender_local_);
      const auto packet = record.subspan(wire::ForwardHeader::kSize);
      EXPECT_EQ(packet.size(), tags.size() < 3 ? 1024u : DataPacket(0, 0).size());
      tags.push_back(packet.back());
    });
    if (tags.size() < 4) usleep(1000);
  }
  EXPECT_EQ(tags, (std::vector<uint8_t>{2, 3, 4, 5}));
  EXPECT_TRUE(a.NothingForwarded()) << "nothing more on the socket once the ring is there";
  close(doorbell);
}

TEST_F(DeviceServiceTest, OnceAProcessAsksTheKernelSteersItsPacketsToItsOwnSocketPastTheService) {
  FakeProcess a, b;
  ASSERT_EQ(a.Join(address_), 0);
  ASSERT_EQ(b.Join(address_), 0);
  if (a.steered < 0) GTEST_SKIP() << "this kernel has no SO_ATTACH_REUSEPORT_CBPF: the service forwards everything";
  ASSERT_GE(b.steered, 0);
  // Until it asks, the service forwards (a process that never takes its socket loses nothing).
  SendToService(DataPacket(wire::WithOwner24(a.owner, 0x11), 1));
  EXPECT_EQ(a.NextForwarded(), DataPacket(wire::WithOwner24(a.owner, 0x11), 1));
  EXPECT_EQ(a.Request(wire::ControlType::kSteer, 0), 0);
  EXPECT_EQ(b.Request(wire::ControlType::kSteer, 0), 0);
  SendToService(DataPacket(wire::WithOwner24(a.owner, 0x11), 2));
  SendToService(DataPacket(wire::WithOwner24(b.owner, 0x22), 3));
  EXPECT_EQ(a.NextSteered(), DataPacket(wire::WithOwner24(a.owner, 0x11), 2));
  EXPECT_EQ(b.NextSteered(), DataPacket(wire::WithOwner24(b.owner, 0x22), 3));
  EXPECT_TRUE(a.NothingForwarded());
  EXPECT_TRUE(b.NothingForwarded());
  // What names no owner stays the service's to route: a new connection goes to its listener, forwarded.
  const uint64_t sid = wire::ServiceIdOf(wire::kPortSpaceTcp, 7472);
  ASSERT_EQ(b.Request(wire::ControlType::kListen, sid), 0);
  SendToService(ReqPacket(sid));
  EXPECT_EQ(b.NextForwarded(), ReqPacket(sid));
  EXPECT_TRUE(b.NextSteered(100).empty());
  // A process gone: its packets are no longer steered anywhere (here: to the service, no route), and the others' are.
  const uint8_t gone = a.owner;
  a.Close();
  for (int i = 0; i < 500 && b.Request(wire::ControlType::kListen, wire::ServiceIdOf(wire::kPortSpaceTcp, 9)) != 0; ++i)
    usleep(1000);
  SendToService(DataPacket(wire::WithOwner24(gone, 0x11), 4));
  SendToService(DataPacket(wire::WithOwner24(b.owner, 0x22), 5));
  EXPECT_EQ(b.NextSteered(), DataPacket(wire::WithOwner24(b.owner, 0x22), 5));
  EXPECT_TRUE(b.NextSteered(100).empty());
  EXPECT_TRUE(b.NothingForwarded());
  // Asking twice, or without a socket, is refused or nothing new.
  EXPECT_EQ(b.Request(wire::ControlType::kSteer, 0), 0);
}

}  // namespace
}  // namespace uroce::service
