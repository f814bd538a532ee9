// Debian clients where the device meets what CI systems impose (issue 9, "Runs where CI runs"):
//  - io_uring refused by a seccomp filter (tests/without_io_uring, as the default profile of Docker >= 25 and
//    containerd 2.0): the engine falls back to plain sockets, says so in one line, and ibv_rc_pingpong -c passes;
//    forced onto io_uring (UROCE_TRANSPORT=uring) it cannot start;
//  - a device that cannot start (io_uring forced but refused, a bad UROCE_ADDR, a bad UROCE_CONFIG, no free address):
//    ibv_open_device fails with an errno after one line on stderr saying why, and the client reports it and exits
//    with an error, never a crash.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <ostream>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/client_runner.h"

namespace uroce::tests {
namespace {

using std::chrono::seconds;

constexpr std::chrono::milliseconds kPairTimeout = seconds(120);
constexpr std::chrono::milliseconds kToolTimeout = seconds(60);

// The engine's fallback notice (verbs_api/engine.cc).
const char* const kFallbackNotice =
    R"(uroce: io_uring is refused here \(Operation not permitted\); using plain UDP sockets \(recvmmsg/sendmmsg \+ poll\)\. UROCE_TRANSPORT=socket skips the attempt\s*)";

size_t CountLines(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  size_t n = 0;
  for (const std::string& line : Lines(text)) n += std::regex_match(line, re);
  return n;
}

// The lines a program wrote that our library printed ("uroce: ...").
std::vector<std::string> UroceLines(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& line : Lines(text)) {
    if (line.rfind("uroce: ", 0) == 0) out.push_back(line);
  }
  return out;
}

class RestrictedClientsTest : public ClientTest {
 protected:
  // tests/without_io_uring in the runfiles, or "" after recording a failure.
  std::string Launcher() {
    const std::string path = RunfilesPath("tests/without_io_uring");
    if (path.empty()) ADD_FAILURE() << "tests/without_io_uring is not in the runfiles: the target needs it in data";
    return path;
  }
  EnvOverrides EnvWith(const std::string& key, const std::string& value) const {
    EnvOverrides env = env_;
    env.emplace_back(key, value);
    return env;
  }
};

TEST_F(RestrictedClientsTest, RcPingpongFallsBackToSocketsWhereIoUringIsRefused) {
  const std::string launcher = Launcher();
  const std::string prog = Program("ibv_rc_pingpong");
  if (launcher.empty() || prog.empty()) return;
  const int port = Port();
  ASSERT_GT(port, 0);
  const std::vector<std::string> args = {launcher, prog, "-g", "0", "-c", "-n", "200", "-s", "8192",
                                         "-p", std::to_string(port)};
  std::vector<std::string> client_args = args;
  client_args.push_back("127.0.0.1");
  // UROCE_TRANSPORT unset (auto), whatever the test's environment says: the fallback is what is under test.
  const EnvOverrides env = EnvWith("UROCE_TRANSPORT", "");
  const PairResult r = RunPair(args, client_args, env, port, kPairTimeout);
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  for (const ProcessResult* side : {&r.server, &r.client}) {
    EXPECT_TRUE(HasLine(side->output, R"(\s*[0-9]+ bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec\s*)")) << r.Describe();
    EXPECT_TRUE(HasLine(side->output, R"(\s*200 iters in [0-9.]+ seconds = [0-9.]+ usec/iter\s*)")) << r.Describe();
    EXPECT_EQ(side->output.find("invalid data"), std::string::npos) << r.Describe();  // -c found a bad byte
    // The notice, once, and nothing else from the library.
    EXPECT_EQ(CountLines(side->output, kFallbackNotice), 1u) << r.Describe();
    EXPECT_EQ(UroceLines(side->output).size(), 1u) << r.Describe();
  }
}

// A device that cannot start: each cause makes ibv_open_device fail with one line from the library; the client says
// it could not open the device and exits 1 (rdma-core's examples on the server and the client side, perftest).
struct StartFailure {
  std::string name;
  std::string key, value;  // environment
  std::string line;        // the library's one line (regex)
  bool under_seccomp = false;
};

void PrintTo(const StartFailure& c, std::ostream* os) { *os << c.name; }

std::string RegexEscaped(const std::string& text) {
  return std::regex_replace(text, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
}

class StartFailureTest : public RestrictedClientsTest, public ::testing::WithParamInterface<StartFailure> {};

TEST_P(StartFailureTest, ClientsExitWithAnErrorAndOneLineSayingWhy) {
  StartFailure c = GetParam();
  const std::string prog = Program("ibv_rc_pingpong");
  if (prog.empty()) return;
  int held = -1;  // a socket holding the RoCEv2 port on every address, for "no free address"
  if (c.key == "UROCE_PORT" && c.value.empty()) {
    held = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(held, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof sa;
    ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    ASSERT_EQ(getsockname(held, reinterpret_cast<sockaddr*>(&sa), &len), 0);
    c.value = std::to_string(ntohs(sa.sin_port));
    c.line = std::regex_replace(c.line, std::regex("<port>"), c.value);
  }
  if (c.key == "UROCE_CONFIG" && c.value.empty()) {
    c.value = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/bad_uroce.conf";
    std::ofstream(c.value) << "# a typo in the MTU\nmtu = 4000\n";
    c.line = std::regex_replace(c.line, std::regex("<file>"), RegexEscaped(c.value));
  }
  std::vector<std::string> prefix;
  if (c.under_seccomp) {
    const std::string launcher = Launcher();
    if (launcher.empty()) return;
    prefix.push_back(launcher);
  }
  const int port = Port();
  std::vector<std::string> server = prefix;
  server.insert(server.end(), {prog, "-g", "0", "-p", std::to_string(port)});
  std::vector<std::string> client = server;
  client.push_back("127.0.0.1");
  const std::string perftest = Program("ib_write_bw");
  if (perftest.empty()) return;
  std::vector<std::string> perftest_server = prefix;
  perftest_server.insert(perftest_server.end(), {perftest, "-d", "uroce0", "-x", "0", "-p", std::to_string(port)});
  for (const auto& argv : {server, client, perftest_server}) {
    // Each opens the device before any handshake, so each runs alone.
    const ProcessResult r = RunProcess(argv, EnvWith(c.key, c.value), kToolTimeout);
    EXPECT_TRUE(r.started && !r.timed_out) << r.Describe();
    EXPECT_EQ(r.term_signal, 0) << r.Describe();  // never a crash
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    // rdma-core's examples, perftest.
    EXPECT_TRUE(HasLine(r.output, R"(\s*Couldn't get context for (uroce0|the device)\s*)")) << r.Describe();
    const std::vector<std::string> lines = UroceLines(r.output);
    ASSERT_EQ(lines.size(), 1u) << r.Describe();
    EXPECT_TRUE(std::regex_match(lines[0], std::regex(c.line))) << lines[0];
  }
  if (held >= 0) close(held);
}

INSTANTIATE_TEST_SUITE_P(
    Causes, StartFailureTest,
    ::testing::Values(
        StartFailure{"IoUringForcedButRefused", "UROCE_TRANSPORT", "uring",
                     R"(uroce: UROCE_TRANSPORT=uring, but io_uring is refused here: Operation not permitted)", true},
        StartFailure{"UnparsableAddress", "UROCE_ADDR", "127.0.0.300", R"(uroce: UROCE_ADDR: bad address '127\.0\.0\.300')"},
        StartFailure{"AddressNotOnThisHost", "UROCE_ADDR", "192.0.2.1",  // TEST-NET-1 (RFC 5737)
                     R"(uroce: cannot bind 192\.0\.2\.1:4791: Cannot assign requested address)"},
        StartFailure{"BadTransportName", "UROCE_TRANSPORT", "rdma", R"(uroce: UROCE_TRANSPORT: bad transport 'rdma' \(uring or socket\))"},
        StartFailure{"MissingConfigFile", "UROCE_CONFIG", "/nonexistent/uroce.conf",
                     R"(uroce: cannot read UROCE_CONFIG=/nonexistent/uroce\.conf: No such file or directory)"},
        StartFailure{"BadConfigFile", "UROCE_CONFIG", "", R"(uroce: <file>:2: bad mtu '4000' \(256, 512, 1024, 2048 or 4096\))"},
        StartFailure{"NoFreeAddress", "UROCE_PORT", "",
                     R"(uroce: no free address in 127\.0\.0\.1-127\.0\.255\.254 on UDP port <port> \(held on all addresses by another program, such as kernel rxe\? UROCE_PORT or UROCE_ADDR choose another\))"}),
    [](const ::testing::TestParamInfo<StartFailure>& info) { return info.param.name; });

// 300 processes of one machine open the device at once and hold it: each gets its own address (the embedded default
// goes past 127.0.0.254), none fails or crashes. By default io_uring where the kernel gives it; under the sandbox's
// user namespace, ring memory counts against RLIMIT_MEMLOCK, which (8 MiB) runs out after ~100 processes, and the
// rest fall back to sockets, saying so. tools/open_bench.cc measures how long it took.
class ManyProcessesTest : public RestrictedClientsTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(ManyProcessesTest, ThreeHundredProcessesOpenTheDeviceAtOnce) {
  const std::string bench = RunfilesPath("tools/uroce_open_bench");
  ASSERT_FALSE(bench.empty()) << "tools/uroce_open_bench is not in the runfiles: the target needs it in data";
  const ProcessResult r = RunProcess({bench, "300"}, EnvWith("UROCE_TRANSPORT", GetParam()), seconds(180));
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  EXPECT_TRUE(HasLine(r.output, R"(300 processes: 300 opened uroce0 in [0-9.]+ s .*, 300 distinct addresses, 0 failed, 0 crashed)"))
      << r.Describe();
  // Only fallback notices from the library, at most one per process.
  const std::vector<std::string> lines = UroceLines(r.output);
  for (const std::string& line : lines) EXPECT_NE(line.find("uroce: io_uring is refused here"), std::string::npos) << line;
  EXPECT_LE(lines.size(), 300u);
  if (std::string(GetParam()) == "socket") EXPECT_TRUE(lines.empty()) << r.Describe();
  std::cout << MatchLine(r.output, std::regex("300 processes: .*"))[0] << "; " << lines.size()
            << " fell back to sockets\n";
}

INSTANTIATE_TEST_SUITE_P(Transports, ManyProcessesTest, ::testing::Values("", "socket"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param[0] ? info.param : "auto");
                         });

}  // namespace
}  // namespace uroce::tests
