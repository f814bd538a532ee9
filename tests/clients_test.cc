// The unmodified Debian RDMA programs (ibverbs-utils: ibv_devices, ibv_devinfo, ibv_ud_pingpong, ibv_uc_pingpong;
// perftest: ib_send_bw, ib_send_lat, ib_write_bw) run against our drop-in libibverbs.so.1 and must behave as they do
// on a real RoCEv2 HCA: exit 0, print their result lines, and find no corruption with their own `-c` (--chk) check.
//
// Each server/client pair shakes hands over a TCP port picked free at run time; each process's emulated HCA binds the
// first free 127.0.N.M:4791, so these tests run in parallel with each other and with other targets. The programs are
// installed by `tools/uroce setup` (Debian packages ibverbs-utils and perftest); a missing one fails its test.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/client_runner.h"

namespace uroce::tests {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Generous: on an idle 2-core machine the slowest pair (10000 round trips of 64 KiB at -m 1024) takes ~4 s, but with
// two busy-polling clients competing with their own progress threads and parallel builds it has taken ~16 s, and ~37 s
// under --config=tsan.
constexpr milliseconds kPairTimeout = seconds(120);
constexpr milliseconds kToolTimeout = seconds(30);

class ClientsTest : public ClientTest {
 protected:
  EnvOverrides EnvWithMtu(int mtu) const {
    EnvOverrides env = env_;
    env.emplace_back("UROCE_MTU", std::to_string(mtu));
    return env;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// ibv_devices / ibv_devinfo: the device as rdma-core's own tools see it.
// ---------------------------------------------------------------------------------------------------------------

TEST_F(ClientsTest, IbvDevicesListsUroce0WithNonZeroGuid) {
  const std::string prog = Program("ibv_devices");
  if (prog.empty()) return;
  const ProcessResult r = RunProcess({prog}, env_, kToolTimeout);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  const auto m = MatchLine(r.output, std::regex(R"(\s*uroce0\s+([0-9a-f]{16})\s*)"));
  ASSERT_FALSE(m.empty()) << r.Describe();
  EXPECT_NE(m[1], "0000000000000000") << r.Describe();
}

TEST_F(ClientsTest, IbvDevinfoVerboseShowsActiveRoceV2Port) {
  const std::string prog = Program("ibv_devinfo");
  if (prog.empty()) return;
  const ProcessResult r = RunProcess({prog, "-v"}, env_, kToolTimeout);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  EXPECT_TRUE(HasLine(r.output, R"(hca_id:\s+uroce0\s*)")) << r.Describe();
  EXPECT_TRUE(HasLine(r.output, R"(\s*state:\s+PORT_ACTIVE \(4\)\s*)")) << r.Describe();
  EXPECT_TRUE(HasLine(r.output, R"(\s*link_layer:\s+Ethernet\s*)")) << r.Describe();
  EXPECT_TRUE(HasLine(r.output, R"(\s*active_mtu:\s+4096 \(5\)\s*)")) << r.Describe();
  EXPECT_TRUE(HasLine(r.output, R"(\s*max_mtu:\s+4096 \(5\)\s*)")) << r.Describe();

  // GID 0 is the IPv4-mapped address of the process's own 127.0.N.M (RoCEv2 GIDs of IPv4 addresses, IBTA Annex A17),
  // one of the embedded default's 127.0.0.1 ... 127.0.255.254 (host part 1-254).
  const auto gid =
      MatchLine(r.output, std::regex(R"(\s*GID\[  0\]:\s+::ffff:127\.0\.([0-9]{1,3})\.([0-9]{1,3}), RoCE v2\s*)"));
  ASSERT_FALSE(gid.empty()) << r.Describe();
  EXPECT_LE(std::stoi(gid[1]), 255);
  const int host = std::stoi(gid[2]);
  EXPECT_GE(host, 1);
  EXPECT_LE(host, 254);

  // Not Mellanox (0x02c9) or Amazon (0x1d0f): their provider-specific code paths in clients key on the vendor id.
  const auto vendor = MatchLine(r.output, std::regex(R"(\s*vendor_id:\s+0x([0-9a-f]+)\s*)"));
  ASSERT_FALSE(vendor.empty()) << r.Describe();
  const unsigned long vendor_id = std::stoul(vendor[1], nullptr, 16);
  EXPECT_NE(vendor_id, 0x02c9ul) << vendor[0];
  EXPECT_NE(vendor_id, 0x1d0ful) << vendor[0];
}

class DevinfoMtuTest : public ClientsTest, public ::testing::WithParamInterface<int> {};

TEST_P(DevinfoMtuTest, ActiveMtuFollowsUroceMtu) {
  const int mtu = GetParam();
  const std::string prog = Program("ibv_devinfo");
  if (prog.empty()) return;
  const ProcessResult r = RunProcess({prog}, EnvWithMtu(mtu), kToolTimeout);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  // enum ibv_mtu: IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5 (verbs.h; IBTA 9.7.8 / table 226 PMTU encoding).
  int code = 0;
  for (int m = mtu; m > 128; m /= 2) ++code;
  EXPECT_TRUE(HasLine(r.output, R"(\s*active_mtu:\s+)" + std::to_string(mtu) + R"( \()" + std::to_string(code) +
                                     R"(\)\s*)"))
      << "UROCE_MTU=" << mtu << "\n"
      << r.Describe();
  EXPECT_TRUE(HasLine(r.output, R"(\s*max_mtu:\s+4096 \(5\)\s*)")) << r.Describe();
}

INSTANTIATE_TEST_SUITE_P(AllMtus, DevinfoMtuTest, ::testing::Values(256, 512, 1024, 2048, 4096),
                         [](const ::testing::TestParamInfo<int>& info) { return "Mtu" + std::to_string(info.param); });

// ---------------------------------------------------------------------------------------------------------------
// ibv_ud_pingpong / ibv_uc_pingpong (rdma-core libibverbs/examples): 10000 round trips with the data checked.
// ---------------------------------------------------------------------------------------------------------------

struct PingpongCase {
  const char* program;  // ibv_ud_pingpong or ibv_uc_pingpong
  int size;             // -s: message bytes
  int port_mtu;         // UROCE_MTU of both processes
  int path_mtu;         // -m (UC only; 0: not passed)
  bool events;          // -e: sleep on the completion channel instead of busy-polling the CQ
  int iters;            // -n
};

std::string PingpongName(const ::testing::TestParamInfo<PingpongCase>& info) {
  const PingpongCase& c = info.param;
  std::string name = std::string(c.program).find("_ud_") != std::string::npos ? "Ud" : "Uc";
  name += "Size" + std::to_string(c.size) + "PortMtu" + std::to_string(c.port_mtu);
  if (c.path_mtu != 0) name += "PathMtu" + std::to_string(c.path_mtu);
  name += c.events ? "Events" : "Polling";
  return name;
}

class PingpongTest : public ClientsTest, public ::testing::WithParamInterface<PingpongCase> {};

TEST_P(PingpongTest, RoundTripsWithValidatedData) {
  const PingpongCase& c = GetParam();
  const std::string prog = Program(c.program);
  if (prog.empty()) return;
  const int port = Port();
  ASSERT_GT(port, 0);
  std::vector<std::string> args = {prog, "-g", "0", "-c", "-n", std::to_string(c.iters), "-s", std::to_string(c.size),
                                   "-p", std::to_string(port)};
  if (c.path_mtu != 0) {
    args.push_back("-m");
    args.push_back(std::to_string(c.path_mtu));
  }
  if (c.events) args.push_back("-e");
  std::vector<std::string> client_args = args;
  client_args.push_back("127.0.0.1");

  const PairResult r = RunPair(args, client_args, EnvWithMtu(c.port_mtu), port, kPairTimeout);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();

  const std::regex iters_line(std::to_string(c.iters) + R"( iters in [0-9.]+ seconds = [0-9.]+ usec/iter\s*)");
  const std::regex bytes_line(std::to_string(static_cast<long long>(c.iters) * c.size * 2) +
                              R"( bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec\s*)");
  for (const ProcessResult* side : {&r.server, &r.client}) {
    EXPECT_FALSE(MatchLine(side->output, iters_line).empty()) << r.Describe();
    EXPECT_FALSE(MatchLine(side->output, bytes_line).empty()) << r.Describe();
    // -c: the program compares the received buffer with the sender's pattern and prints this per bad page (its exit
    // status does not change).
    EXPECT_EQ(side->output.find("invalid data"), std::string::npos) << r.Describe();
    // Both ends see each other's RoCEv2 GID, ::ffff:127.0.N.M.
    EXPECT_TRUE(HasLine(side->output, R"(\s*remote address: .*GID ::ffff:127\.0\.[0-9]+\.[0-9]+\s*)"))
        << r.Describe();
  }
}

// UD: one message per packet, so the size is bounded by the port MTU (ud_pingpong refuses larger sizes).
INSTANTIATE_TEST_SUITE_P(Ud, PingpongTest,
                         ::testing::Values(PingpongCase{"ibv_ud_pingpong", 1, 4096, 0, false, 10000},
                                           PingpongCase{"ibv_ud_pingpong", 1, 4096, 0, true, 10000},
                                           PingpongCase{"ibv_ud_pingpong", 1024, 1024, 0, false, 10000},
                                           PingpongCase{"ibv_ud_pingpong", 1024, 1024, 0, true, 10000},
                                           PingpongCase{"ibv_ud_pingpong", 4096, 4096, 0, false, 10000},
                                           PingpongCase{"ibv_ud_pingpong", 4096, 4096, 0, true, 10000}),
                         PingpongName);

// UC: messages are segmented at the path MTU (-m) into FIRST/MIDDLE/LAST packets (IBTA 9.5); 64 KiB at -m 1024 is
// 64 packets per message.
std::vector<PingpongCase> UcCases() {
  std::vector<PingpongCase> cases;
  for (int size : {1, 4096, 65536}) {
    for (int path_mtu : {1024, 4096}) {
      for (bool events : {false, true}) cases.push_back({"ibv_uc_pingpong", size, 4096, path_mtu, events, 10000});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Uc, PingpongTest, ::testing::ValuesIn(UcCases()), PingpongName);

// ---------------------------------------------------------------------------------------------------------------
// perftest: the client prints the results table; the row must carry the size, the iteration count and a measure.
// ---------------------------------------------------------------------------------------------------------------

struct PerftestCase {
  const char* program;     // ib_send_bw, ib_send_lat, ib_write_bw
  const char* connection;  // -c UD / UC
  int size;                // -s
  int port_mtu;            // UROCE_MTU
  int iters;               // -n
};

std::string PerftestName(const ::testing::TestParamInfo<PerftestCase>& info) {
  const PerftestCase& c = info.param;
  std::string name;
  for (const char* p = c.program; *p != '\0'; ++p) {
    if (*p == '_') continue;
    name += *p;
  }
  return name + c.connection + "Size" + std::to_string(c.size) + "PortMtu" + std::to_string(c.port_mtu);
}

class PerftestTest : public ClientsTest, public ::testing::WithParamInterface<PerftestCase> {};

TEST_P(PerftestTest, PrintsResultRow) {
  const PerftestCase& c = GetParam();
  const std::string prog = Program(c.program);
  if (prog.empty()) return;
  const int port = Port();
  ASSERT_GT(port, 0);
  const std::vector<std::string> args = {prog, "-d", "uroce0", "-x", "0", "-F", "-c", c.connection,
                                         "-s", std::to_string(c.size), "-n", std::to_string(c.iters),
                                         "-p", std::to_string(port)};
  std::vector<std::string> client_args = args;
  client_args.push_back("127.0.0.1");

  const PairResult r = RunPair(args, client_args, EnvWithMtu(c.port_mtu), port, kPairTimeout);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();

  const bool latency = std::string(c.program).find("_lat") != std::string::npos;
  // bw: " #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]"
  // lat: " #bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec] t_stdev[usec] 99% 99.9%"
  const std::string number = R"(([0-9]+(?:\.[0-9]+)?))";
  const std::regex row(R"(\s*)" + std::to_string(c.size) + R"(\s+)" + std::to_string(c.iters) + R"(\s+)" + number +
                       R"(\s+)" + number + R"(\s+)" + number + R"(.*)");
  const auto m = MatchLine(r.client.output, row);
  ASSERT_FALSE(m.empty()) << r.Describe();
  if (latency) {
    const double t_min = std::stod(m[1]);
    const double t_max = std::stod(m[2]);
    EXPECT_GT(t_min, 0.0) << m[0];
    EXPECT_GE(t_max, t_min) << m[0];
  } else {
    EXPECT_GT(std::stod(m[2]), 0.0) << "average bandwidth: " << m[0];
    EXPECT_GT(std::stod(m[3]), 0.0) << "message rate: " << m[0];
  }
  for (const ProcessResult* side : {&r.server, &r.client}) {
    EXPECT_TRUE(HasLine(side->output, R"(\s*Connection type : )" + std::string(c.connection) + R"(\s.*)"))
        << r.Describe();
    EXPECT_TRUE(HasLine(side->output, R"(\s*Link type\s+: Ethernet\s*)")) << r.Describe();
    EXPECT_TRUE(HasLine(side->output, R"(\s*Mtu\s+: )" + std::to_string(c.port_mtu) + R"(\[B\]\s*)"))
        << r.Describe();
  }
}

// ib_send_bw over UD/UC has no flow control on the wire (no ACKs, no RNR NAK: IBTA 9.7.5.1 covers RC only), and a
// loopback UDP socket drops what overflows its receive buffer where a lossless RoCE fabric (PFC) would hold the sender
// back; perftest's server then waits 120 s for the missing messages and exits 17. The counts here stay within what
// the receiver's socket absorbs even when it does not run at all; the Flood cases below (their own targets, see
// tests/BUILD) send 2000 messages and rely on uroce's pacing.
INSTANTIATE_TEST_SUITE_P(Ud, PerftestTest,
                         ::testing::Values(PerftestCase{"ib_send_bw", "UD", 4096, 4096, 200},
                                           PerftestCase{"ib_send_bw", "UD", 1024, 1024, 200},
                                           PerftestCase{"ib_send_lat", "UD", 2, 4096, 1000},
                                           PerftestCase{"ib_send_lat", "UD", 4096, 4096, 1000}),
                         PerftestName);

// ib_write_bw needs nothing from the responder's CPU (RDMA WRITE consumes no receive WQE), so a lost write cannot hang
// it; it keeps perftest's default 5000 iterations.
INSTANTIATE_TEST_SUITE_P(Uc, PerftestTest,
                         ::testing::Values(PerftestCase{"ib_send_bw", "UC", 65536, 4096, 20},
                                           PerftestCase{"ib_send_bw", "UC", 65536, 1024, 20},
                                           PerftestCase{"ib_send_bw", "UC", 4096, 4096, 200},
                                           PerftestCase{"ib_write_bw", "UC", 65536, 4096, 5000},
                                           PerftestCase{"ib_write_bw", "UC", 65536, 1024, 5000},
                                           PerftestCase{"ib_write_bw", "UC", 1, 4096, 5000}),
                         PerftestName);

// 2000 x 64 KiB UC and 2000 x 4 KiB UD (perftest's `-n 2000`), far beyond what a socket buffer absorbs while its
// receiver is not running: every message must arrive. A receiver whose queue fills answers with CNPs and the sender
// paces its UC/UD sends (emu::DeviceCore::kCnpIntervalNs), and the sockets ask for 64 MiB of buffer (granted whole
// with CAP_NET_ADMIN; else capped by net.core.rmem_max). Without them about half of these runs hung. Run only by the
// clients_flood targets (tests/BUILD: exclusive, unsandboxed), whose filter selects them.
INSTANTIATE_TEST_SUITE_P(Flood, PerftestTest,
                         ::testing::Values(PerftestCase{"ib_send_bw", "UC", 65536, 4096, 2000},
                                           PerftestCase{"ib_send_bw", "UD", 4096, 4096, 2000}),
                         PerftestName);

// ---------------------------------------------------------------------------------------------------------------
// UROCE_STATS=1 (`uroce run --stats`): each process prints its device's counters when it ends.

// The transport the test's environment asks for (UROCE_TRANSPORT; clients_socket_test sets "socket").
std::string ExpectedTransport() {
  const char* t = std::getenv("UROCE_TRANSPORT");
  return t != nullptr ? t : "";
}

TEST_F(ClientsTest, StatsPrintCountersAtExit) {
  const std::string prog = Program("ibv_ud_pingpong");
  if (prog.empty()) return;
  const int port = Port();
  ASSERT_GT(port, 0);
  const std::vector<std::string> args = {prog, "-g", "0", "-n", "100", "-s", "512", "-p", std::to_string(port)};
  std::vector<std::string> client_args = args;
  client_args.push_back("127.0.0.1");
  EnvOverrides env = env_;
  env.emplace_back("UROCE_STATS", "1");
  const PairResult r = RunPair(args, client_args, env, port, kPairTimeout);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  for (const ProcessResult* side : {&r.server, &r.client}) {
    // The header names the transport, so a run with UROCE_TRANSPORT=socket (clients_socket_test) proves it ran on
    // sockets; without it, io_uring unless the engine said it fell back.
    const bool fell_back = side->output.find("uroce: io_uring is refused here") != std::string::npos;
    const std::string transport = ExpectedTransport() == "socket" || fell_back ? "socket" : "io_uring";
    EXPECT_TRUE(HasLine(side->output, R"(uroce: counters of uroce0 at 127\.0\.[0-9]+\.[0-9]+ \()" + transport +
                                          R"( transport\))"))
        << side->output;
    // 100 round trips: at least 100 datagrams each way (plus pingpong's initial posts), and nothing malformed.
    const auto tx = MatchLine(side->output, std::regex(R"(tx_packets ([0-9]+))"));
    const auto rx = MatchLine(side->output, std::regex(R"(rx_packets ([0-9]+))"));
    ASSERT_EQ(tx.size(), 2u) << side->output;
    ASSERT_EQ(rx.size(), 2u) << side->output;
    EXPECT_GE(std::stoull(tx[1]), 100u);
    EXPECT_GE(std::stoull(rx[1]), 100u);
    EXPECT_TRUE(HasLine(side->output, "rx_malformed 0")) << side->output;
  }
}

}  // namespace
}  // namespace uroce::tests
