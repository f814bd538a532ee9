// Unmodified Debian clients using shared receive queues and XRC against our libibverbs.so.1: ibv_srq_pingpong (16
// QPs on one SRQ, data checked by the program's own -c, polling and with completion events), ibv_xsrq_pingpong with
// one server serving several client processes at once, and perftest's ib_send_bw --use-srq, ib_send_bw -c XRC and
// ib_write_bw -c XRC. Each exits 0 and prints its result.
//
// Every process has its own emulated HCA (embedded default), so an XRC domain is shared within a process, not
// between the client processes as on one real HCA: see README (XRC between processes). ibv_xsrq_pingpong's server
// answers client i through another client's target QP naming client i's SRQ, which needs the clients to share one
// HCA: the three-client case runs them on the host device (UROCE_DEVICE=host), where a target delivers into another
// process's SRQ of its domain.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/client_runner.h"

namespace uroce::tests {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Generous for a 2-core machine running parallel builds and sanitizers (see clients_test.cc).
constexpr milliseconds kPairTimeout = seconds(180);

class SrqXrcClientsTest : public ClientTest {
 protected:
  // Runs a perftest pair with the options the brief names and checks both ends' result.
  void RunPerftest(const std::string& name, const std::vector<std::string>& extra) {
    const std::string prog = Program(name);
    if (prog.empty()) return;
    const int port = Port();
    std::vector<std::string> server = {prog, "-d", "uroce0", "-x", "0", "-F", "-p", std::to_string(port)};
    server.insert(server.end(), extra.begin(), extra.end());
    std::vector<std::string> client = server;
    client.push_back("127.0.0.1");
    const PairResult r = RunPair(server, client, env_, port, kPairTimeout);
    ASSERT_TRUE(r.Succeeded()) << r.Describe();
    // The result row: "65536 <iterations> <peak> <average> <msg rate>".
    EXPECT_TRUE(HasLine(r.client.output, R"(\s*65536\s+\d+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s*)")) << r.Describe();
  }

};

TEST_F(SrqXrcClientsTest, SrqPingpong16QpsChecked) {
  const std::string prog = Program("ibv_srq_pingpong");
  if (prog.empty()) return;
  const int port = Port();
  const std::vector<std::string> server = {prog, "-g", "0", "-q", "16", "-c", "-n", "10000", "-p", std::to_string(port)};
  std::vector<std::string> client = server;
  client.push_back("127.0.0.1");
  const PairResult r = RunPair(server, client, env_, port, kPairTimeout);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  EXPECT_TRUE(HasLine(r.client.output, R"(10000 iters in [0-9.]+ seconds = [0-9.]+ usec/iter)")) << r.Describe();
  EXPECT_TRUE(HasLine(r.server.output, R"(10000 iters in [0-9.]+ seconds = [0-9.]+ usec/iter)")) << r.Describe();
}

TEST_F(SrqXrcClientsTest, SrqPingpong16QpsCheckedWithCompletionEvents) {
  const std::string prog = Program("ibv_srq_pingpong");
  if (prog.empty()) return;
  const int port = Port();
  const std::vector<std::string> server = {prog, "-g", "0",  "-q", "16", "-c", "-e",
                                           "-n", "10000", "-p", std::to_string(port)};
  std::vector<std::string> client = server;
  client.push_back("127.0.0.1");
  const PairResult r = RunPair(server, client, env_, port, kPairTimeout);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  EXPECT_TRUE(HasLine(r.client.output, R"(10000 iters in [0-9.]+ seconds = [0-9.]+ usec/iter)")) << r.Describe();
}

TEST_F(SrqXrcClientsTest, XsrqPingpongServerServesThreeClientsAtOnce) {
  const std::string prog = Program("ibv_xsrq_pingpong");
  if (prog.empty()) return;
  constexpr int kClients = 3;
  const int port = Port();
  // One device shared by the four processes, on an address of this test's own.
  const std::string address = FreeLoopbackDeviceAddress();
  ASSERT_FALSE(address.empty());
  EnvOverrides env = env_;
  env.emplace_back("UROCE_DEVICE", "host");
  env.emplace_back("UROCE_ADDR", address);
  Process server = Process::Start({prog, "-g", "0", "-c", std::to_string(kClients), "-p", std::to_string(port)}, env);
  ASSERT_TRUE(server.started());
  const auto deadline = std::chrono::steady_clock::now() + kPairTimeout;
  while (!TcpPortListening(port) && !server.Exited() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(20));
  ASSERT_TRUE(TcpPortListening(port)) << server.Kill().Describe();
  std::vector<Process> clients;
  for (int i = 0; i < kClients; ++i)
    clients.push_back(Process::Start({prog, "-g", "0", "-p", std::to_string(port), "127.0.0.1"}, env));
  for (Process& c : clients) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    const ProcessResult r = c.Wait(std::max(left, milliseconds(1)));
    EXPECT_TRUE(r.Succeeded()) << r.Describe();
    EXPECT_TRUE(HasLine(r.output, "success")) << r.Describe();
  }
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
  const ProcessResult s = server.Wait(std::max(left, milliseconds(1)));
  EXPECT_TRUE(s.Succeeded()) << s.Describe();
  EXPECT_TRUE(HasLine(s.output, "success")) << s.Describe();
}

TEST_F(SrqXrcClientsTest, SendBwUseSrq) { RunPerftest("ib_send_bw", {"--use-srq"}); }

TEST_F(SrqXrcClientsTest, SendBwXrc) { RunPerftest("ib_send_bw", {"-c", "XRC"}); }

TEST_F(SrqXrcClientsTest, WriteBwXrc) { RunPerftest("ib_write_bw", {"-c", "XRC"}); }

}  // namespace
}  // namespace uroce::tests
