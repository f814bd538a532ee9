// Connection-managed RDMA through our drop-in librdmacm.so.1 and libibverbs.so.1: the unmodified Debian rdmacm-utils
// (rping, ucmatose, udaddy, rdma_server/rdma_client, rdma_xserver/rdma_xclient, cmtime) and perftest's `-R` mode, in
// pairs over loopback. Each process owns its own uroce device (127.0.N.M); the client dials 127.0.0.1 and finds the
// listener through the host's rdma_cm port registry (rdmacm/port_registry.h), with real IB CM MADs on the wire.
//
// A server is "listening" once its (port space, port) is published in the registry; every pair uses a port picked
// free at run time, so tests run in parallel.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "rdmacm/port_registry.h"
#include "tests/client_runner.h"
#include "wire/cm_mad.h"

namespace uroce::tests {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr milliseconds kPairTimeout = seconds(120);

class RdmaCmClientsTest : public ClientTest {
 protected:
  // Starts the server, waits until it listens on (ps, port), starts the client, waits for both.
  PairResult RunCmPair(const std::vector<std::string>& server, const std::vector<std::string>& client,
                       uint16_t port_space, int port, const EnvOverrides& server_env,
                       const EnvOverrides& client_env, milliseconds timeout = kPairTimeout) {
    return RunStartedPair(
        [&] { return std::make_unique<Process>(Process::Start(server, server_env)); },
        [&] { return rdmacm::FindPortOwner(port_space, static_cast<uint16_t>(port)).has_value(); },
        [&] { return std::make_unique<Process>(Process::Start(client, client_env)); }, timeout);
  }
  PairResult RunCmPair(const std::vector<std::string>& server, const std::vector<std::string>& client,
                       uint16_t port_space, int port) {
    return RunCmPair(server, client, port_space, port, env_, env_);
  }
  EnvOverrides WithLoss(int seed) const {
    EnvOverrides env = env_;
    env.emplace_back("UROCE_FAULTS", "loss=0.02,seed=" + std::to_string(seed));
    return env;
  }
  // Waits until (ps, port) is listened on, or `timeout`.
  static bool WaitListening(uint16_t ps, int port, Process& server, milliseconds timeout = seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (rdmacm::FindPortOwner(ps, static_cast<uint16_t>(port))) return true;
      if (server.Exited()) return false;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }
};

constexpr uint16_t kTcp = wire::kPortSpaceTcp;
constexpr uint16_t kUdp = wire::kPortSpaceUdp;
constexpr uint16_t kIb = wire::kPortSpaceIb;

int CountMatching(const std::string& text, const std::regex& re) {
  int n = 0;
  for (const std::string& line : Lines(text))
    if (std::regex_match(line, re)) ++n;
  return n;
}

// ---------------------------------------------------------------------------------------------------------------
// rping: RC SEND + RDMA READ + RDMA WRITE per ping, the CM driven from a thread of its own; -V checks the data.
// ---------------------------------------------------------------------------------------------------------------

void ExpectRpingClient(const ProcessResult& client, int count) {
  // -v prints each ping: "ping data: rdma-ping-N: ABCD..." (rping.c).
  EXPECT_EQ(CountMatching(client.output, std::regex(R"(ping data: rdma-ping-\d+: .*)")), count) << client.Describe();
}

TEST_F(RdmaCmClientsTest, Rping) {
  const std::string rping = Program("rping");
  const int port = Port();
  if (rping.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  PairResult r = RunCmPair({rping, "-s", "-a", "127.0.0.1", "-v", "-p", p},
                           {rping, "-c", "-a", "127.0.0.1", "-C", "10", "-v", "-V", "-p", p}, kTcp, port);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  ExpectRpingClient(r.client, 10);
  EXPECT_EQ(CountMatching(r.server.output, std::regex(R"(server ping data: rdma-ping-\d+: .*)")), 10)
      << r.server.Describe();
}

TEST_F(RdmaCmClientsTest, RpingLargeMessages) {
  const std::string rping = Program("rping");
  const int port = Port();
  if (rping.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  // rping's own bound: "valid range is 23 to 65536" but it refuses 65536 itself (size > RPING_BUFSIZE - 1).
  PairResult r = RunCmPair({rping, "-s", "-S", "65535", "-p", p},
                           {rping, "-c", "-a", "127.0.0.1", "-S", "65535", "-C", "20", "-V", "-p", p}, kTcp, port);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
}

// "This host" as the kernel's rdma_cm has it: a listener on the wildcard or any loopback address, IPv4 or IPv6, is
// found by a dial to any other of them, whatever 127.0.0.N each process's device has.
struct AddressCase {
  std::string name, listen, dial;
};
void PrintTo(const AddressCase& c, std::ostream* os) { *os << c.name; }
class RpingAddressTest : public RdmaCmClientsTest, public ::testing::WithParamInterface<AddressCase> {};

TEST_P(RpingAddressTest, ConnectsAndPings) {
  const std::string rping = Program("rping");
  const int port = Port();
  if (rping.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  PairResult r = RunCmPair({rping, "-s", "-a", GetParam().listen, "-p", p},
                           {rping, "-c", "-a", GetParam().dial, "-C", "3", "-v", "-V", "-p", p}, kTcp, port);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  ExpectRpingClient(r.client, 3);
}

INSTANTIATE_TEST_SUITE_P(ThisHost, RpingAddressTest,
                         ::testing::Values(AddressCase{"Ipv6Loopback", "::1", "::1"},
                                           AddressCase{"Ipv6AnyFromIpv4Loopback", "::", "127.0.0.1"},
                                           AddressCase{"Ipv4AnyFromOtherLoopback", "0.0.0.0", "127.0.0.5"},
                                           AddressCase{"LoopbackFromAny", "127.0.0.7", "0.0.0.0"}),
                         [](const ::testing::TestParamInfo<AddressCase>& i) { return i.param.name; });

// -q: the client makes and moves its own QP with rdma_init_qp_attr, then rdma_establish (CONNECT_RESPONSE path).
TEST_F(RdmaCmClientsTest, RpingSelfModifiedQp) {
  const std::string rping = Program("rping");
  const int port = Port();
  if (rping.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  PairResult r = RunCmPair({rping, "-s", "-v", "-p", p},
                           {rping, "-c", "-a", "127.0.0.1", "-C", "3", "-v", "-V", "-q", "-p", p}, kTcp, port);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  ExpectRpingClient(r.client, 3);
}

// -P: a persistent server serves two clients at once (two children of one listener). The second client dials once
// the first is pinging: rping's persistent server keeps the newest request in one variable that its main thread
// copies, so two requests handled back to back lose one of them (rping's own race, timing-dependent on any device).
TEST_F(RdmaCmClientsTest, RpingPersistentServerTwoClients) {
  const std::string rping = Program("rping");
  const int port = Port();
  if (rping.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  Process server = Process::Start({rping, "-s", "-P", "-v", "-p", p}, env_);
  ASSERT_TRUE(WaitListening(kTcp, port, server)) << server.Kill().Describe();
  Process a = Process::Start({"/usr/bin/stdbuf", "-oL", rping, "-c", "-a", "127.0.0.1", "-C", "2000", "-V", "-v", "-p", p},
                             env_);
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (CountMatching(a.OutputSoFar(), std::regex(R"(ping data: .*)")) == 0 &&
         std::chrono::steady_clock::now() < deadline && !a.Exited())
    std::this_thread::sleep_for(milliseconds(5));
  Process b = Process::Start({rping, "-c", "-a", "127.0.0.1", "-C", "20", "-V", "-v", "-p", p}, env_);
  const ProcessResult rb = b.Wait(kPairTimeout), ra = a.Wait(kPairTimeout);
  const ProcessResult rs = server.Kill();
  EXPECT_TRUE(ra.Succeeded()) << ra.Describe() << rs.Describe();
  EXPECT_TRUE(rb.Succeeded()) << rb.Describe() << rs.Describe();
  ExpectRpingClient(ra, 2000);
  ExpectRpingClient(rb, 20);
}

TEST_F(RdmaCmClientsTest, RpingUnderLoss) {
  const std::string rping = Program("rping");
  const int port = Port();
  if (rping.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  PairResult r = RunCmPair({rping, "-s", "-v", "-p", p},
                           {rping, "-c", "-a", "127.0.0.1", "-C", "50", "-v", "-V", "-p", p}, kTcp, port,
                           WithLoss(11), WithLoss(12));
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  ExpectRpingClient(r.client, 50);
}

// ---------------------------------------------------------------------------------------------------------------
// ucmatose: many connections from one event channel, SEND/RECV on each, server-initiated disconnect.
// ---------------------------------------------------------------------------------------------------------------

void ExpectCmatose(const PairResult& r) {
  EXPECT_TRUE(HasLine(r.server.output, "return status 0")) << r.Describe();
  EXPECT_TRUE(HasLine(r.client.output, "return status 0")) << r.Describe();
  EXPECT_TRUE(HasLine(r.client.output, "data transfers complete")) << r.Describe();
}

TEST_F(RdmaCmClientsTest, Ucmatose) {
  const std::string ucmatose = Program("ucmatose");
  const int port = Port();
  if (ucmatose.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  PairResult r = RunCmPair({ucmatose, "-p", p}, {ucmatose, "-s", "127.0.0.1", "-p", p}, kTcp, port);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  ExpectCmatose(r);
}

TEST_F(RdmaCmClientsTest, UcmatoseTenConnections) {
  const std::string ucmatose = Program("ucmatose");
  const int port = Port();
  if (ucmatose.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  PairResult r = RunCmPair({ucmatose, "-p", p, "-c", "10", "-C", "100", "-S", "4096"},
                           {ucmatose, "-s", "127.0.0.1", "-p", p, "-c", "10", "-C", "100", "-S", "4096"}, kTcp, port);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  ExpectCmatose(r);
}

TEST_F(RdmaCmClientsTest, UcmatoseUnderLoss) {
  const std::string ucmatose = Program("ucmatose");
  const int port = Port();
  if (ucmatose.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  PairResult r = RunCmPair({ucmatose, "-p", p, "-c", "4", "-C", "20"},
                           {ucmatose, "-s", "127.0.0.1", "-p", p, "-c", "4", "-C", "20"}, kTcp, port, WithLoss(21),
                           WithLoss(22));
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  ExpectCmatose(r);
}

// ---------------------------------------------------------------------------------------------------------------
// udaddy: UD through SIDR, address handles from the ESTABLISHED event and from the receive's GRH.
// ---------------------------------------------------------------------------------------------------------------

TEST_F(RdmaCmClientsTest, Udaddy) {
  const std::string udaddy = Program("udaddy");
  const int port = Port();
  if (udaddy.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  // udaddy has no port option (its -p is the port space): it always uses 7174 (UDP port space).
  (void)p;
  PairResult r = RunCmPair({udaddy}, {udaddy, "-s", "127.0.0.1"}, kUdp, 7174);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  EXPECT_TRUE(HasLine(r.server.output, "return status 0")) << r.Describe();
  EXPECT_TRUE(HasLine(r.client.output, "return status 0")) << r.Describe();
}

// ---------------------------------------------------------------------------------------------------------------
// rdma_server / rdma_client: the synchronous API (rdma_getaddrinfo, rdma_create_ep, rdma_get_request), the
// library's default PD and CQs, inline sends with lkey 0.
// ---------------------------------------------------------------------------------------------------------------

TEST_F(RdmaCmClientsTest, RdmaServerClient) {
  const std::string server = Program("rdma_server"), client = Program("rdma_client");
  const int port = Port();
  if (server.empty() || client.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  PairResult r = RunCmPair({server, "-p", p}, {client, "-s", "127.0.0.1", "-p", p}, kTcp, port);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  EXPECT_TRUE(HasLine(r.server.output, "rdma_server: end 0")) << r.Describe();
  EXPECT_TRUE(HasLine(r.client.output, "rdma_client: end 0")) << r.Describe();
}

// No listener: the client's device answers its own REQ with REJ 8 at once, so rdma_connect fails with
// ECONNREFUSED within a second (not after 15 retransmissions).
TEST_F(RdmaCmClientsTest, RdmaClientWithoutServerIsRefusedAtOnce) {
  const std::string client = Program("rdma_client");
  const int port = Port();
  if (client.empty() || port <= 0) return;
  const ProcessResult r = RunProcess({client, "-s", "127.0.0.1", "-p", std::to_string(port)}, env_, seconds(30));
  ASSERT_TRUE(r.started) << r.Describe();
  EXPECT_FALSE(r.timed_out) << r.Describe();
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.output.find("Connection refused"), std::string::npos) << r.Describe();
  // A second from start to exit (the REJ 8 retries last 200 ms). A sanitized library (--config=asan/tsan) starts
  // several times slower; there the message alone shows the REJ path (a lost REQ would end in UNREACHABLE).
  std::string sanitizer;
  ClientEnvironment(&sanitizer);
  EXPECT_LT(r.elapsed, sanitizer.empty() ? seconds(1) : seconds(5)) << r.Describe();
}

// ---------------------------------------------------------------------------------------------------------------
// rdma_xserver / rdma_xclient: RC, and XRC with the SRQ made by rdma_create_srq (PS_IB, SRQN in the REP's private
// data, the target's QPN in the REP's Local EECN).
// ---------------------------------------------------------------------------------------------------------------

TEST_F(RdmaCmClientsTest, RdmaXserverXclientRc) {
  const std::string server = Program("rdma_xserver"), client = Program("rdma_xclient");
  const int port = Port();
  if (server.empty() || client.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  PairResult r = RunCmPair({server, "-p", p, "-c", "r"}, {client, "-s", "127.0.0.1", "-p", p, "-c", "r"}, kTcp, port);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  EXPECT_TRUE(HasLine(r.server.output, ".*: end 0")) << r.Describe();
  EXPECT_TRUE(HasLine(r.client.output, ".*: end 0")) << r.Describe();
}

TEST_F(RdmaCmClientsTest, RdmaXserverXclientXrc) {
  const std::string server = Program("rdma_xserver"), client = Program("rdma_xclient");
  const int port = Port();
  if (server.empty() || client.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  PairResult r = RunCmPair({server, "-p", p, "-c", "x"}, {client, "-s", "127.0.0.1", "-p", p, "-c", "x"}, kIb, port);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  EXPECT_TRUE(HasLine(r.server.output, ".*: end 0")) << r.Describe();
  EXPECT_TRUE(HasLine(r.client.output, ".*: end 0")) << r.Describe();
}

// ---------------------------------------------------------------------------------------------------------------
// cmtime: 100 connections set up and torn down at once; the server never exits by itself.
// ---------------------------------------------------------------------------------------------------------------

class CmtimeTest : public RdmaCmClientsTest {
 protected:
  void Run(const EnvOverrides& server_env, const EnvOverrides& client_env, int connections) {
    const std::string cmtime = Program("cmtime");
    const int port = Port();
    if (cmtime.empty() || port <= 0) return;
    const std::string p = std::to_string(port);
    Process server = Process::Start({cmtime, "-p", p}, server_env);
    ASSERT_TRUE(WaitListening(kTcp, port, server)) << server.Kill().Describe();
    const ProcessResult client = RunProcess(
        {cmtime, "-s", "127.0.0.1", "-p", p, "-c", std::to_string(connections)}, client_env, kPairTimeout);
    const ProcessResult s = server.Kill();
    ASSERT_TRUE(client.Succeeded()) << client.Describe() << s.Describe();
    // The step table (cmtime.c show_perf), and no "event:" error line.
    EXPECT_TRUE(HasLine(client.output, R"(\s*step\s+total ms\s+max ms\s+min us\s+us / conn\s*)")) << client.Describe();
    EXPECT_FALSE(HasLine(client.output, ".*event: .*")) << client.Describe();
    std::cout << client.output;
  }
};

TEST_F(CmtimeTest, HundredConnections) { Run(env_, env_, 100); }
TEST_F(CmtimeTest, HundredConnectionsUnderLoss) { Run(WithLoss(31), WithLoss(32), 100); }

// ---------------------------------------------------------------------------------------------------------------
// perftest -R: the handshake over an rdma_cm RC connection, the test QPs through rdma_create_qp_ex.
// ---------------------------------------------------------------------------------------------------------------

struct PerftestCase {
  std::string name;
  std::string program;
  std::vector<std::string> args;
};
void PrintTo(const PerftestCase& c, std::ostream* os) { *os << c.name; }

class PerftestRdmaCmTest : public RdmaCmClientsTest, public ::testing::WithParamInterface<PerftestCase> {};

TEST_P(PerftestRdmaCmTest, Runs) {
  const PerftestCase& c = GetParam();
  const std::string prog = Program(c.program);
  const int port = Port();
  if (prog.empty() || port <= 0) return;
  std::vector<std::string> server = {prog, "-d", "uroce0", "-R", "-F", "-p", std::to_string(port)};
  server.insert(server.end(), c.args.begin(), c.args.end());
  std::vector<std::string> client = server;
  client.push_back("127.0.0.1");
  PairResult r = RunCmPair(server, client, kTcp, port);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  EXPECT_TRUE(HasLine(r.server.output, R"(.*Data ex. method\s*:\s*rdma_cm.*)")) << r.Describe();
}

INSTANTIATE_TEST_SUITE_P(
    Perftest, PerftestRdmaCmTest,
    ::testing::Values(PerftestCase{"SendBw", "ib_send_bw", {"-n", "200"}},
                      PerftestCase{"WriteBw", "ib_write_bw", {"-n", "200"}},
                      PerftestCase{"ReadLat", "ib_read_lat", {"-n", "200"}},
                      PerftestCase{"SendBwUd", "ib_send_bw", {"-c", "UD", "-n", "200"}}),
    [](const ::testing::TestParamInfo<PerftestCase>& i) { return i.param.name; });

// ---------------------------------------------------------------------------------------------------------------
// mckey: UD multicast (rdma_join_multicast_ex, ibv_attach_mcast, sends to QPN 0xFFFFFF) as IP multicast on loopback.
// ---------------------------------------------------------------------------------------------------------------

TEST_F(RdmaCmClientsTest, MckeyMulticast) {
  const std::string mckey = Program("mckey");
  const int port = Port();
  if (mckey.empty() || port <= 0) return;
  // A group of its own (parallel tests must not hear each other): 239.<from the free port>.
  const std::string group =
      "239.1." + std::to_string((port >> 8) & 0xFF) + "." + std::to_string(port & 0xFF);
  Process receiver = Process::Start({"/usr/bin/stdbuf", "-oL", mckey, "-m", group, "-C", "20"}, env_);
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (receiver.OutputSoFar().find("receiving data transfers") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline && !receiver.Exited())
    std::this_thread::sleep_for(milliseconds(20));
  const ProcessResult sender = RunProcess({mckey, "-m", group, "-s", "-C", "20"}, env_, kPairTimeout);
  const ProcessResult r = receiver.Wait(seconds(30));
  ASSERT_TRUE(sender.Succeeded()) << sender.Describe() << r.Describe();
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  EXPECT_TRUE(HasLine(r.output, "mckey: joined dgid: ::ffff:" + group + " mlid 0x0 sl 0")) << r.Describe();
  EXPECT_TRUE(HasLine(r.output, "data transfers complete")) << r.Describe();
  EXPECT_TRUE(HasLine(sender.output, "return status 0")) << sender.Describe();
}

// ---------------------------------------------------------------------------------------------------------------
// rstream / riostream: stream rsockets (rsocket/rbind/rlisten/raccept/rconnect, rsend/rrecv, rpoll, rshutdown/rclose)
// over RC, and riomap/riowrite.
// ---------------------------------------------------------------------------------------------------------------

// rstream's (or riostream's) two command lines for a pair on `port`: `args` on both, the client's dialling 127.0.0.1.
struct RstreamCommands {
  std::vector<std::string> server, client;
};
RstreamCommands RstreamPair(const std::string& program, int port, const std::vector<std::string>& args) {
  RstreamCommands c;
  c.server = {program, "-p", std::to_string(port)};
  c.server.insert(c.server.end(), args.begin(), args.end());
  c.client = c.server;
  c.client.insert(c.client.begin() + 1, {"-s", "127.0.0.1"});
  return c;
}

struct RstreamCase {
  std::string name;
  std::vector<std::string> args;  // the same on both sides
  std::string program = "rstream";
};
void PrintTo(const RstreamCase& c, std::ostream* os) { *os << c.name; }
class RstreamTest : public RdmaCmClientsTest, public ::testing::WithParamInterface<RstreamCase> {};

TEST_P(RstreamTest, TransfersAndReports) {
  const std::string rstream = Program(GetParam().program);
  const int port = Port();
  if (rstream.empty() || port <= 0) return;
  const RstreamCommands c = RstreamPair(rstream, port, GetParam().args);
  PairResult r = RunCmPair(c.server, c.client, kTcp, port);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  // The header and one result line: "custom  4k  1k  1  7.8m  0.22s  0.30  108.04".
  const std::string header = R"(name\s+bytes\s+xfers\s+iters\s+total\s+time\s+Gb/sec\s+usec/xfer\s*)";
  const std::string result = R"(custom\s+\S+\s+\S+\s+1\s+\S+\s+[0-9.]+s\s+[0-9.]+\s+[0-9.]+\s*)";
  for (const ProcessResult* side : {&r.server, &r.client}) {
    EXPECT_TRUE(HasLine(side->output, header)) << r.Describe();
    EXPECT_TRUE(HasLine(side->output, result)) << r.Describe();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rsockets, RstreamTest,
    ::testing::Values(RstreamCase{"NonBlocking4k", {"-S", "4096", "-C", "1000"}},
                      RstreamCase{"Verified64k", {"-S", "65536", "-C", "200", "-T", "v"}},
                      RstreamCase{"Blocking100", {"-S", "100", "-C", "1000", "-T", "b"}},
                      RstreamCase{"AsyncPoll4k", {"-S", "4096", "-C", "500", "-T", "a"}},
                      RstreamCase{"VerifiedOneMegabyte", {"-S", "1000000", "-C", "20", "-T", "v"}},
                      // riostream: riomap on both sides, riowrite into the peer's buffer, the last byte polled.
                      RstreamCase{"Riostream4k", {"-S", "4096", "-C", "100"}, "riostream"},
                      RstreamCase{"RiostreamVerified64k", {"-S", "65536", "-C", "100", "-T", "v"}, "riostream"},
                      RstreamCase{"RiostreamBlocking100", {"-S", "100", "-C", "1000", "-T", "b"}, "riostream"}),
    [](const ::testing::TestParamInfo<RstreamCase>& i) { return i.param.name; });

// A counter of uroce's from a process's UROCE_STATS=1 report; -1 when it is not there.
long long StatsCounter(const std::string& output, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("(?:^|\\n)" + name + " (\\d+)"))) return -1;
  return std::stoll(m[1]);
}

// A stream rsocket sends only against credits (the peer's posted receive buffers), not into RNR NAKs: 1 MB
// transfers, each twice the 512 KiB of receive buffers, verified byte for byte, and neither side's responder sent an
// RNR NAK or dropped a packet out of sequence (counted in each side's UROCE_STATS report). With RNR NAKs as the flow
// control, runs like this one had 2-12 RNR NAKs per side, each followed by the drop of what was in flight behind it.
TEST_F(RdmaCmClientsTest, RstreamMovesMegabytesWithoutRnrNaks) {
  const std::string rstream = Program("rstream");
  const int port = Port();
  if (rstream.empty() || port <= 0) return;
  EnvOverrides env = env_;
  env.emplace_back("UROCE_STATS", "1");
  const RstreamCommands c = RstreamPair(rstream, port, {"-S", "1000000", "-C", "20", "-T", "v"});
  PairResult r = RunCmPair(c.server, c.client, kTcp, port, env, env);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  const std::regex result(R"(custom\s+976k\s+20\s+1\s+\S+\s+[0-9.]+s\s+[0-9.]+\s+[0-9.]+\s*)");
  for (const ProcessResult* side : {&r.server, &r.client}) {
    EXPECT_EQ(CountMatching(side->output, result), 1) << r.Describe();
    EXPECT_EQ(StatsCounter(side->output, "rc_rnr_naks_sent"), 0) << r.Describe();
    EXPECT_EQ(StatsCounter(side->output, "rx_out_of_sequence"), 0) << r.Describe();
    EXPECT_GE(StatsCounter(side->output, "rx_packets"), 20 * 1000000 / 4096) << r.Describe();
  }
}

// rcopy: a file copied over a stream rsocket -- the client mmaps it and sends all of it in one blocking rsend, the
// server receives into an mmap of the destination. The server serves until killed. A short count from that rsend
// (it returned after the first 480 KiB) made the client send its CLOSE message into the file and both hang.
TEST_F(RdmaCmClientsTest, RcopyCopiesAFileByteForByte) {
  const std::string rcopy = Program("rcopy");
  const int port = Port();
  if (rcopy.empty() || port <= 0) return;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const std::string source = dir + "/rcopy_source." + std::to_string(getpid());
  const std::string copy = dir + "/rcopy_copy." + std::to_string(getpid());
  std::string bytes(5000000, '\0');  // ~10x the receive buffers, not a multiple of anything
  uint32_t x = 12345;
  for (char& c : bytes) c = char((x = x * 1103515245 + 12345) >> 24);
  {
    std::ofstream out(source, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    ASSERT_TRUE(out.good());
  }
  Process server = Process::Start({rcopy, "-p", std::to_string(port)}, env_);
  ASSERT_TRUE(WaitListening(kTcp, port, server)) << server.Kill().Describe();
  const ProcessResult client =
      RunProcess({rcopy, source, "127.0.0.1:" + copy, "-p", std::to_string(port)}, env_, seconds(60));
  const ProcessResult served = server.Kill();  // it serves for ever
  ASSERT_TRUE(client.Succeeded()) << client.Describe() << served.Describe();
  EXPECT_TRUE(HasLine(client.output, R"(opening\.\.\.transferring\.\.\.closing\.\.\.done)")) << client.Describe();
  std::ifstream in(copy, std::ios::binary);
  const std::string copied((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(copied.size(), bytes.size()) << served.Describe();
  EXPECT_TRUE(copied == bytes) << "the copy differs from the source" << served.Describe();
  std::remove(source.c_str());
  std::remove(copy.c_str());
}

// Debian's librspreload (librdmacm1; rsocket(7)), LD_PRELOAD'ed, makes a plain sockets program an rsockets one: its
// socket(2) becomes rsocket() for every AF_INET / AF_INET6 socket. "" where it is not installed.
std::string Librspreload() {
  for (const char* dir : {"/usr/lib/x86_64-linux-gnu/rsocket", "/usr/lib/aarch64-linux-gnu/rsocket", "/usr/lib/rsocket"}) {
    const std::string path = std::string(dir) + "/librspreload.so";
    if (access(path.c_str(), R_OK) == 0) return path;
  }
  return "";
}

// `env` with `preload` added to LD_PRELOAD, after a sanitizer's runtime, which must come first.
EnvOverrides WithPreload(const EnvOverrides& env, const std::string& preload) {
  EnvOverrides out = env;
  std::string preloads;
  for (const auto& [name, value] : out)
    if (name == "LD_PRELOAD") preloads = value;
  out.emplace_back("LD_PRELOAD", preloads.empty() ? preload : preloads + ":" + preload);
  return out;
}

// rstream -T s is a plain sockets program (socket, bind, listen, accept, connect, send, recv; no rsocket call); under
// librspreload its stream runs over an RC QP of uroce, checked byte for byte (-T v) and seen in uroce's counters.
// uroce's own UDP sockets must stay the kernel's: the library made its first one with socket(2) while starting, which
// librspreload turned into an rsocket over uroce itself -- and both programs waited on that start for ever.
TEST_F(RdmaCmClientsTest, LibrspreloadRunsAPlainSocketsProgramOverUroce) {
  const std::string rstream = Program("rstream");
  const int port = Port();
  if (rstream.empty() || port <= 0) return;
  const std::string preload = Librspreload();
  if (preload.empty()) GTEST_SKIP() << "librspreload.so is not installed (Debian's librdmacm1)";
  EnvOverrides env = WithPreload(env_, preload);
  env.emplace_back("UROCE_STATS", "1");
  const RstreamCommands c = RstreamPair(rstream, port, {"-S", "4096", "-C", "1000", "-T", "s", "-T", "v"});
  PairResult r = RunCmPair(c.server, c.client, kTcp, port, env, env);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  const std::regex result(R"(custom\s+4k\s+1k\s+1\s+\S+\s+[0-9.]+s\s+[0-9.]+\s+[0-9.]+\s*)");
  for (const ProcessResult* side : {&r.server, &r.client}) {
    EXPECT_EQ(CountMatching(side->output, result), 1) << r.Describe();
    // Each side received the other's 1000 messages of 4 KiB (one packet each at the 4096-byte MTU) over uroce.
    EXPECT_GE(StatsCounter(side->output, "rx_packets"), 1000) << r.Describe();
  }
}

// A program under librspreload that dials a plain TCP server: its rconnect finds no rsocket listening, and
// librspreload turns the socket into a TCP one and connects again -- which first asks rgetsockname for the address's
// size with a NULL address and a length of 0 (getsockname(2) allows it). That call failed with EINVAL, and so did the
// connect: rstream printed "rconnect: Invalid argument".
TEST_F(RdmaCmClientsTest, LibrspreloadFallsBackToTcpForAPlainServer) {
  const std::string rstream = Program("rstream");
  const int port = Port();
  if (rstream.empty() || port <= 0) return;
  const std::string preload = Librspreload();
  if (preload.empty()) GTEST_SKIP() << "librspreload.so is not installed (Debian's librdmacm1)";
  const RstreamCommands c = RstreamPair(rstream, port, {"-S", "10000", "-C", "100", "-T", "s", "-T", "v"});
  const PairResult r = RunPair(c.server, env_, c.client, WithPreload(env_, preload), port, kPairTimeout);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  const std::regex result(R"(custom\s+9.7k\s+100\s+1\s+\S+\s+[0-9.]+s\s+[0-9.]+\s+[0-9.]+\s*)");
  for (const ProcessResult* side : {&r.server, &r.client})
    EXPECT_EQ(CountMatching(side->output, result), 1) << r.Describe();
}

// ---------------------------------------------------------------------------------------------------------------
// udpong: datagram rsockets (UD QPs found through the port registry); the server never exits by itself.
// ---------------------------------------------------------------------------------------------------------------

struct UdpongCase {
  std::string name;
  std::vector<std::string> args;
};
void PrintTo(const UdpongCase& c, std::ostream* os) { *os << c.name; }
class UdpongTest : public RdmaCmClientsTest, public ::testing::WithParamInterface<UdpongCase> {};

TEST_P(UdpongTest, Reports) {
  const std::string udpong = Program("udpong");
  const int port = Port();
  if (udpong.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  Process server = Process::Start({udpong, "-p", p}, env_);
  ASSERT_TRUE(WaitListening(rdmacm::kRsocketDatagramPortSpace, port, server)) << server.Kill().Describe();
  std::vector<std::string> client = {udpong, "-s", "127.0.0.1", "-p", p};
  client.insert(client.end(), GetParam().args.begin(), GetParam().args.end());
  const ProcessResult c = RunProcess(client, env_, kPairTimeout);
  const ProcessResult s = server.Kill();
  ASSERT_TRUE(c.Succeeded()) << c.Describe() << s.Describe();
  // Still serving when killed: no crash, and no exit on an answer to a client that has gone (udpong's server
  // exits on a failed rsendto).
  EXPECT_TRUE(s.timed_out) << s.Describe();
  EXPECT_TRUE(HasLine(c.output, R"(name\s+bytes\s+xfers\s+total\s+time\s+Gb/sec\s+usec/xfer\s*)")) << c.Describe();
  // "custom  1000  984  960k  0.11s  0.07  112.21": datagrams may be dropped (UD, as UDP), the line must be there.
  EXPECT_TRUE(HasLine(c.output, R"(custom\s+\S+\s+[0-9]+k?\s+\S+\s+[0-9.]+s\s+[0-9.]+\s+[0-9.]+\s*)")) << c.Describe();
}

INSTANTIATE_TEST_SUITE_P(Rsockets, UdpongTest,
                         ::testing::Values(UdpongCase{"Bandwidth", {"-S", "1000", "-C", "1000"}},
                                           UdpongCase{"Echo", {"-T", "e", "-S", "500", "-C", "200"}},
                                           UdpongCase{"Blocking", {"-T", "b", "-S", "64", "-C", "100"}}),
                         [](const ::testing::TestParamInfo<UdpongCase>& i) { return i.param.name; });

// ---------------------------------------------------------------------------------------------------------------
// A peer killed mid-run: the survivor's rdma_disconnect gets no DREP, its DREQ times out, and it still sees
// DISCONNECTED and finishes.
// ---------------------------------------------------------------------------------------------------------------

TEST_F(RdmaCmClientsTest, KilledClientLeavesServerDisconnected) {
  const std::string rping = Program("rping");
  const int port = Port();
  if (rping.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  Process server = Process::Start({"/usr/bin/stdbuf", "-oL", "-eL", rping, "-s", "-v", "-d", "-p", p}, env_);
  ASSERT_TRUE(WaitListening(kTcp, port, server)) << server.Kill().Describe();
  Process client =
      Process::Start({"/usr/bin/stdbuf", "-oL", rping, "-c", "-a", "127.0.0.1", "-C", "1000000", "-v", "-p", p}, env_);
  // Let it run a while, then kill it without a goodbye.
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (CountMatching(client.OutputSoFar(), std::regex(R"(ping data: .*)")) < 20 &&
         std::chrono::steady_clock::now() < deadline && !client.Exited())
    std::this_thread::sleep_for(milliseconds(20));
  ASSERT_FALSE(client.Exited()) << client.Wait(seconds(1)).Describe();
  kill(client.pid(), SIGKILL);
  client.Wait(seconds(5));
  const ProcessResult s = server.Wait(seconds(90));
  EXPECT_FALSE(s.timed_out) << s.Describe();
  EXPECT_NE(s.output.find("DISCONNECT EVENT"), std::string::npos) << s.Describe();
}

// ---------------------------------------------------------------------------------------------------------------
// Careless and hostile processes on the same host.
// ---------------------------------------------------------------------------------------------------------------

// A client killed between its REQ and its RTU (a program killed a few ms into the handshake): its kernel would have
// sent a REJ for it, and rping's server ends on the REJECTED event instead of waiting for ever; or, when that REJ
// comes before rping's rdma_accept, on rdma_accept failing with EINVAL (the kernel's ib_send_cm_rep refuses a
// connection a REJ has ended; seen in ~1 run of 10). It printed DISCONNECT without ESTABLISHED and hung in 3 runs of
// 6 when the dead peer was taken for an established one.
TEST_F(RdmaCmClientsTest, AClientKilledBeforeItsRtuEndsTheServerWithAnEvent) {
  const std::string rping = Program("rping");
  const std::string quitter = RunfilesPath("tests/cm_quitter");
  ASSERT_FALSE(quitter.empty()) << "tests/cm_quitter is not in the runfiles";
  const int port = Port();
  if (rping.empty() || port <= 0) return;
  const std::string p = std::to_string(port);
  Process server = Process::Start({rping, "-s", "-a", "127.0.0.1", "-v", "-d", "-p", p}, env_);
  ASSERT_TRUE(WaitListening(kTcp, port, server)) << server.Kill().Describe();
  const ProcessResult q = RunProcess({quitter, "127.0.0.1", p}, env_, seconds(30));
  EXPECT_EQ(q.term_signal, SIGKILL) << q.Describe();
  EXPECT_NE(q.output.find("REQ sent"), std::string::npos) << q.Describe();
  const ProcessResult s = server.Wait(seconds(30));  // the REP's retries alone would take about a minute
  EXPECT_FALSE(s.timed_out) << s.Describe();
  EXPECT_NE(s.exit_code, 0) << s.Describe();
  EXPECT_TRUE(HasLine(s.output, R"(cma event RDMA_CM_EVENT_REJECTED, error \d+)") ||
              HasLine(s.output, R"(rdma_accept: Invalid argument)"))
      << s.Describe();
  EXPECT_EQ(s.output.find("ESTABLISHED"), std::string::npos) << s.Describe();
}

// Another user's process holding abstract names uroce uses (bound as nobody, in a child of the test). Root only, out
// of Bazel's sandbox (//tests:rdmacm_strangers_test): elsewhere the test cannot become another user, and skips.
class Squatter {
 public:
  // Binds each of `names` (abstract, SOCK_SEQPACKET listeners for device announcements, datagram sockets for
  // the port registry) as user nobody: 0, kNotAnotherUser when the child cannot become nobody (not root, or a user
  // namespace that maps root alone, as Bazel's sandbox: the target runs "local"), -1 on any other failure.
  static constexpr int kNotAnotherUser = 2;
  int Start(const std::vector<std::string>& seqpacket_names, const std::vector<std::string>& dgram_names) {
    int ready[2], release[2];
    // Close-on-exec: the programs the test starts later must not hold the release pipe open (the stranger would
    // then outlive its Stop).
    if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(release, O_CLOEXEC) != 0) return -1;
    pid_ = fork();
    if (pid_ < 0) return -1;
    if (pid_ == 0) {  // only system calls from here on: the test's threads are not in this process
      close(ready[0]);
      close(release[1]);
      char ok = 1;
      if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) ok = kNotAnotherUser;
      auto bind_all = [&](const std::vector<std::string>& names, int type) {
        for (const std::string& name : names) {
          const int fd = socket(AF_UNIX, type, 0);
          sockaddr_un sun{};
          sun.sun_family = AF_UNIX;
          std::memcpy(sun.sun_path + 1, name.data(), std::min(name.size(), sizeof sun.sun_path - 1));
          const socklen_t len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size());
          if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&sun), len) != 0 ||
              (type == SOCK_SEQPACKET && listen(fd, 16) != 0))
            ok = 0;
        }
      };
      if (ok == 1) bind_all(seqpacket_names, SOCK_SEQPACKET);
      if (ok == 1) bind_all(dgram_names, SOCK_DGRAM);
      (void)!write(ready[1], &ok, 1);
      char c;
      while (read(release[0], &c, 1) > 0) {
      }
      _exit(0);  // its sockets close with it
    }
    close(ready[1]);
    close(release[0]);
    release_fd_ = release[1];
    char ok = 0;
    const bool got = read(ready[0], &ok, 1) == 1;
    close(ready[0]);
    return !got ? -1 : ok == 1 ? 0 : ok == kNotAnotherUser ? kNotAnotherUser : -1;
  }
  // Lets it exit (closing its names) and reaps it.
  void Stop() {
    if (release_fd_ >= 0) close(release_fd_);
    release_fd_ = -1;
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  ~Squatter() { Stop(); }

 private:
  pid_t pid_ = -1;
  int release_fd_ = -1;
};

// Another user takes the device announcement names of a server before it starts, then exits mid-run: the client
// must not take the stranger's socket for the server's (it was disconnected when the stranger exited), and the
// server's own announcement must still be made.
TEST_F(RdmaCmClientsTest, AStrangerHoldingTheServersAnnouncementNamesCannotEndItsConnections) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the stranger as another user";
  const std::string rping = Program("rping");
  const int port = Port();
  if (rping.empty() || port <= 0) return;
  const std::string address = FreeLoopbackDeviceAddress();
  ASSERT_FALSE(address.empty());
  const std::string announce = "uroce/cm/v1/device/" + address;
  Squatter stranger;
  const int started = stranger.Start({announce, announce + "/0", announce + "/ffffffffffffffff"}, {});
  if (started == Squatter::kNotAnotherUser) GTEST_SKIP() << "cannot become another user here";
  ASSERT_EQ(started, 0) << "could not bind the names as nobody";
  const std::string p = std::to_string(port);
  EnvOverrides server_env = env_;
  server_env.emplace_back("UROCE_ADDR", address);
  Process server = Process::Start({"/usr/bin/stdbuf", "-oL", rping, "-s", "-a", "127.0.0.1", "-v", "-p", p}, server_env);
  ASSERT_TRUE(WaitListening(kTcp, port, server)) << server.Kill().Describe();
  Process client = Process::Start(
      {"/usr/bin/stdbuf", "-oL", rping, "-c", "-a", "127.0.0.1", "-C", "3000", "-v", "-V", "-p", p}, env_);
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (CountMatching(client.OutputSoFar(), std::regex(R"(ping data: .*)")) < 20 &&
         std::chrono::steady_clock::now() < deadline && !client.Exited())
    std::this_thread::sleep_for(milliseconds(20));
  stranger.Stop();  // its sockets close mid-run
  const ProcessResult c = client.Wait(kPairTimeout);
  const ProcessResult s = server.Wait(seconds(30));
  EXPECT_TRUE(c.Succeeded()) << c.Describe();
  ExpectRpingClient(c, 3000);
  EXPECT_TRUE(s.Succeeded()) << s.Describe();
  EXPECT_EQ(s.output.find("cannot announce"), std::string::npos) << s.Describe();
}

// Another user publishes port-registry entries for the server's port, naming devices that do not exist, before the
// server listens: a client must find the real server (it got UNREACHABLE when it believed the first entry).
TEST_F(RdmaCmClientsTest, AStrangersPortRegistryEntriesAreNotBelieved) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the stranger as another user";
  const std::string rping = Program("rping");
  const int port = Port();
  if (rping.empty() || port <= 0) return;
  char prefix[48];
  std::snprintf(prefix, sizeof prefix, "uroce/cm/v1/%04x/%d@", kTcp, port);
  std::vector<std::string> fakes;
  for (int i = 1; i <= 32; ++i) fakes.push_back(prefix + std::string("127.1.") + std::to_string(i) + ".77");
  Squatter stranger;
  const int started = stranger.Start({}, fakes);
  if (started == Squatter::kNotAnotherUser) GTEST_SKIP() << "cannot become another user here";
  ASSERT_EQ(started, 0) << "could not bind the names as nobody";
  const std::string p = std::to_string(port);
  PairResult r = RunCmPair({rping, "-s", "-a", "127.0.0.1", "-v", "-p", p},
                           {rping, "-c", "-a", "127.0.0.1", "-C", "10", "-v", "-V", "-p", p}, kTcp, port);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  ExpectRpingClient(r.client, 10);
}

}  // namespace
}  // namespace uroce::tests
