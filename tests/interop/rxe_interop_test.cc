// uroce against a real peer: the Linux kernel's rdma_rxe (the reference software RoCEv2 device) in a QEMU guest.
//
// The guest (tests/interop/build_guest.sh: Debian bookworm's kernel and RDMA clients, cached between runs) boots once
// for every case (RxeGuest, a gtest Environment). The test process moves itself into a network namespace of its own
// (unshare(CLONE_NEWNET)) holding a tap device at kHostAddr, so the guest's eth0 (kGuestAddr, where rxe0 lives) is
// reachable from nowhere else and nothing here touches the host's network. uroce runs in that namespace with its
// address pinned to the tap's (UROCE_ADDR): kernel rxe and uroce both own UDP 4791, each in its own stack.
//
// Each case runs one Debian client pair twice: uroce as server and the guest as client, then the other way round. The
// guest side is started through the guest's command shell (busybox nc -ll -e sh on a TCP port). Both sides use the
// link's MTU, 1024 (rxe's active MTU on a 1500-byte link; uroce gets UROCE_MTU=1024), and their RoCEv2 GID: index 0
// on uroce, index 1 on rxe (index 0 is its link-local GID). Data is checked by the pingpongs' -c and by
// tests/rdma_verify (random WRITE / READ / atomics checked byte for byte), which the test adds to the guest's
// initramfs at boot.
//
// Where the guest cannot run (not root, no /dev/net/tun, no network namespace, no QEMU, no network to download the
// guest's packages) every case is skipped with the reason. Under TCG the guest is slow (~0.5 ms per 4 KiB pingpong
// round trip): iteration counts are small.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rdmacm/port_registry.h"
#include "tests/client_runner.h"
#include "wire/address.h"
#include "wire/cm_mad.h"

namespace uroce::tests {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// The namespace is the test's own: these addresses exist nowhere else.
constexpr char kHostAddr[] = "10.199.0.1";
constexpr char kGuestAddr[] = "10.199.0.2";
constexpr int kPrefixLen = 24;
constexpr char kTap[] = "uroce-tap0";
constexpr int kLinkMtu = 1024;

constexpr milliseconds kBuildTimeout = seconds(900);  // a cold build downloads ~60 MB of packages
constexpr milliseconds kBootTimeout = seconds(180);   // ~5 s on an idle machine under TCG
constexpr milliseconds kCommandTimeout = seconds(30);
constexpr milliseconds kPairTimeout = seconds(120);

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr && dir[0] != '\0' ? dir : "/tmp";
}

std::string Runfile(const std::string& path) {
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    const char* root = std::getenv(var);
    if (root == nullptr || root[0] == '\0') continue;
    const std::string full = std::string(root) + "/uroce/" + path;
    if (::access(full.c_str(), R_OK) == 0) return full;
  }
  return "";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string LastLine(const std::string& text) {
  const std::vector<std::string> lines = Lines(text);
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (!it->empty()) return *it;
  }
  return "";
}

// The guest's cache: $UROCE_GUEST_CACHE, else ~/.cache/uroce-rxe-guest of the user running the test (Bazel gives
// tests a HOME of their own, so it is looked up in the password database).
std::string GuestCacheRoot() {
  const char* env = std::getenv("UROCE_GUEST_CACHE");
  if (env != nullptr && env[0] != '\0') return env;
  const passwd* pw = ::getpwuid(::getuid());
  return std::string(pw != nullptr && pw->pw_dir != nullptr ? pw->pw_dir : "/root") + "/.cache/uroce-rxe-guest";
}

// ---------------------------------------------------------------------------------------------------------------
// A command run by the guest's shell: one TCP connection to its command port carries the command in and everything
// it prints out; the shell's last line reports the exit status.
// ---------------------------------------------------------------------------------------------------------------

constexpr char kExitMarker[] = "uroce-guest-exit:";

class GuestCommand final : public StartedProgram {
 public:
  GuestCommand(int cmd_port, const std::string& command) : start_(Clock::now()) {
    result_.command = "[guest] " + command;
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(cmd_port));
    ::inet_pton(AF_INET, kGuestAddr, &addr.sin_addr);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      result_.output = std::string("cannot reach the guest's command port: ") + std::strerror(errno);
      return;
    }
    // stdin from /dev/null: the programs must not read the command stream. The shell ends at our EOF.
    const std::string script = command + " </dev/null 2>&1; echo " + kExitMarker + "$?\n";
    if (::send(fd_, script.data(), script.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(script.size()) ||
        ::shutdown(fd_, SHUT_WR) != 0) {
      result_.output = std::string("cannot send to the guest: ") + std::strerror(errno);
      return;
    }
    result_.started = true;
  }
  ~GuestCommand() override {
    if (fd_ >= 0) ::close(fd_);
  }

  bool started() const override { return result_.started; }
  bool Exited() override { return !result_.started || ReadAvailable(0); }
  ProcessResult Wait(milliseconds timeout) override {
    const Clock::time_point deadline = Clock::now() + timeout;
    while (result_.started && !ReadAvailable(static_cast<int>(std::min<long long>(
                                  1000, std::max<long long>(0, std::chrono::duration_cast<milliseconds>(
                                                                   deadline - Clock::now())
                                                                   .count()))))) {
      if (Clock::now() >= deadline) return Kill();
    }
    return Finish();
  }
  // Gives up on the command; the caller ends the guest program itself (GuestShell::KillAll).
  ProcessResult Kill() override {
    if (result_.started && !eof_) result_.timed_out = true;
    return Finish();
  }

 private:
  // Reads what has arrived, waiting at most `wait_ms`; true once the guest closed the connection.
  bool ReadAvailable(int wait_ms) {
    while (!eof_) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, wait_ms) <= 0) return false;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        eof_ = true;
        break;
      }
      output_.append(buf, static_cast<size_t>(n));
      wait_ms = 0;
    }
    return eof_;
  }

  ProcessResult Finish() {
    ProcessResult r = result_;
    if (!r.started) return r;
    r.elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start_);
    r.output = output_;
    const size_t marker = output_.rfind(kExitMarker);
    if (eof_ && marker != std::string::npos) {
      r.exit_code = std::atoi(output_.c_str() + marker + std::strlen(kExitMarker));
      r.output = output_.substr(0, marker);
    } else if (eof_) {
      r.output += "\n[the guest's shell ended without reporting an exit status]";
    }
    return r;
  }

  int fd_ = -1;
  bool eof_ = false;
  std::string output_;
  Clock::time_point start_;
  ProcessResult result_;
};

// ---------------------------------------------------------------------------------------------------------------
// The guest, booted once for every case.
// ---------------------------------------------------------------------------------------------------------------

class RxeGuest : public ::testing::Environment {
 public:
  // Why the cases cannot run here (they skip), or why the guest failed (they fail); both empty when it is up.
  const std::string& skip_reason() const { return skip_reason_; }
  const std::string& failure() const { return failure_; }
  int cmd_port() const { return cmd_port_; }

  void SetUp() override {
    const auto start = Clock::now();
    Boot();
    const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
    if (!skip_reason_.empty()) {
      std::cerr << "rxe interop: skipped: " << skip_reason_ << "\n";
    } else if (!failure_.empty()) {
      std::cerr << "rxe interop: guest failed after " << ms << " ms: " << failure_ << "\n";
    } else {
      std::cerr << "rxe interop: guest built/reused and booted in " << ms << " ms\n";
    }
  }

  void TearDown() override {
    if (qemu_) qemu_->Kill();
    qemu_.reset();
  }

  // Runs `command` in the guest and waits for it.
  ProcessResult Run(const std::string& command, milliseconds timeout = kCommandTimeout) const {
    GuestCommand c(cmd_port_, command);
    return c.Wait(timeout);
  }

  // Ends every guest program a case may have left behind (after a failure or timeout).
  void KillAll(const std::string& program) const { Run("killall -q -9 " + program + "; true"); }

  // Whether a socket in the guest listens on TCP `port`. Each look starts a shell in the guest, whose one emulated
  // CPU is also starting the server: look every 50 ms at most.
  bool GuestListening(int port) const {
    std::this_thread::sleep_for(milliseconds(50));
    const ProcessResult r = GuestTcpTables();
    return r.Succeeded() && TcpTableListens(r.output, port);
  }
  // Whether a TCP socket of the guest, in any state, has local port `port` (unknown counts as taken).
  bool GuestPortInUse(int port) const {
    const ProcessResult r = GuestTcpTables();
    return !r.Succeeded() || TcpTableUsesPort(r.output, port);
  }
  // The guest's TCP socket tables (proc(5)), IPv4 and IPv6.
  ProcessResult GuestTcpTables() const { return Run("cat /proc/net/tcp /proc/net/tcp6"); }
  // Whether an rdma_cm id of the guest's kernel listens on `port` (any port space): `rdma resource show cm_id` lists
  // "... state LISTEN ps TCP ... src-addr 10.199.0.2:7174 ...".
  bool GuestCmListening(int port) const {
    std::this_thread::sleep_for(milliseconds(50));
    const ProcessResult r = Run("rdma resource show cm_id");
    if (!r.Succeeded()) return false;
    const std::regex listening(".*state LISTEN .*src-addr [0-9.:]*:" + std::to_string(port) + " .*");
    return !MatchLine(r.output, listening).empty();
  }

 private:
  void Boot() {
    if (::geteuid() != 0) {
      skip_reason_ = "needs root (a network namespace with a tap device for the guest)";
      return;
    }
    const int tun = ::open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (tun < 0) {
      skip_reason_ = std::string("cannot open /dev/net/tun: ") + std::strerror(errno);
      return;
    }
    ::close(tun);
    const std::string qemu = FindProgram("qemu-system-x86_64");
    std::string ip = FindProgram("/usr/sbin/ip");
    if (ip.empty()) ip = FindProgram("/sbin/ip");
    if (qemu.empty() || ip.empty()) {
      skip_reason_ = std::string(qemu.empty() ? "qemu-system-x86_64" : "ip") +
                     " is not installed (`tools/uroce setup` installs qemu-system-x86 and iproute2)";
      return;
    }
    const std::string verify = Runfile("tests/rdma_verify");
    const std::string build = Runfile("tests/interop/build_guest.sh");
    if (verify.empty() || build.empty()) {
      failure_ = "tests/rdma_verify or tests/interop/build_guest.sh is not in the runfiles";
      return;
    }

    // The guest: built once into the cache, reused afterwards.
    const ProcessResult built = RunProcess({build, GuestCacheRoot()}, {}, kBuildTimeout);
    if (!built.Succeeded()) {
      // 2: not root or a tool missing, 3: the packages could not be downloaded — the machine's state, not uroce's.
      if (built.exit_code == 2 || built.exit_code == 3) {
        skip_reason_ = "the guest could not be built: " + LastLine(built.output);
      } else {
        failure_ = "build_guest.sh failed: " + built.Describe();
      }
      return;
    }
    const std::string guest_dir = LastLine(built.output);

    // The initramfs the guest boots: the cached one, then a second cpio archive with rdma_verify (the kernel unpacks
    // concatenated archives in order; Documentation/driver-api/early-userspace/buffer-format.rst).
    const std::string extra_root = TempDir() + "/guest-extra";
    const std::string initramfs = TempDir() + "/initramfs.cpio";
    const ProcessResult packed = RunProcess(
        {"/bin/sh", "-c",
         "set -e; rm -rf \"$1\"; mkdir -p \"$1/usr/local/bin\"; cp \"$2\" \"$1/usr/local/bin/rdma_verify\"; "
         "cat \"$3/initramfs.cpio\" >\"$4\"; cd \"$1\" && find . | cpio --quiet -o -H newc >>\"$4\"",
         "sh", extra_root, verify, guest_dir, initramfs},
        {}, kCommandTimeout);
    if (!packed.Succeeded()) {
      failure_ = "cannot assemble the initramfs: " + packed.Describe();
      return;
    }

    // From here on this process (and every child it starts) lives in a network namespace of its own.
    if (::unshare(CLONE_NEWNET) != 0) {
      skip_reason_ = std::string("cannot create a network namespace (unshare CLONE_NEWNET): ") + std::strerror(errno);
      return;
    }
    const std::string host_cidr = std::string(kHostAddr) + "/" + std::to_string(kPrefixLen);
    for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
             {ip, "link", "set", "lo", "up"},
             {ip, "tuntap", "add", "dev", kTap, "mode", "tap"},
             {ip, "addr", "add", host_cidr, "dev", kTap},
             // The emulated guest drains the tap far slower than uroce fills it: a UD burst (UDP_SEGMENT runs leave
             // back to back, as from a NIC) must wait in the tap's queue, not overflow it (default 1000 packets).
             {ip, "link", "set", kTap, "txqueuelen", "20000"},
             {ip, "link", "set", kTap, "up"}}) {
      const ProcessResult r = RunProcess(cmd, {}, kCommandTimeout);
      if (!r.Succeeded()) {
        failure_ = "cannot set up the namespace's tap device: " + r.Describe();
        return;
      }
    }

    cmd_port_ = FreeTcpPort();
    if (cmd_port_ <= 0) {
      failure_ = "no free TCP port for the guest's command shell";
      return;
    }
    const std::string console = TempDir() + "/guest-console.log";
    qemu_ = std::make_unique<Process>(Process::Start(
        {qemu, "-accel", "tcg", "-cpu", "max", "-smp", "1", "-m", "768", "-nodefaults", "-no-reboot", "-display",
         "none", "-serial", "file:" + console, "-kernel", guest_dir + "/vmlinux", "-initrd", initramfs, "-append",
         "console=ttyS0 panic=-1 quiet uroce_addr=" + std::string(kGuestAddr) + "/" + std::to_string(kPrefixLen) +
             " uroce_cmd_port=" + std::to_string(cmd_port_),
         "-netdev", std::string("tap,id=n0,ifname=") + kTap + ",script=no,downscript=no", "-device",
         "virtio-net-pci,netdev=n0,romfile="},
        {}));
    const Clock::time_point deadline = Clock::now() + kBootTimeout;
    while (ReadFile(console).find("uroce-guest: ready") == std::string::npos) {
      if (qemu_->Exited() || Clock::now() >= deadline) {
        failure_ = "the guest did not come up:\n" + qemu_->Kill().Describe() + "console:\n" + ReadFile(console);
        return;
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
    const ProcessResult link = Run("/usr/bin/rdma link show");
    if (!link.Succeeded() || link.output.find("rxe0") == std::string::npos) {
      failure_ = "no rxe0 in the guest: " + link.Describe() + "console:\n" + ReadFile(console);
    }
  }

  std::string skip_reason_;
  std::string failure_;
  int cmd_port_ = -1;
  std::unique_ptr<Process> qemu_;
};

RxeGuest* const g_guest = static_cast<RxeGuest*>(::testing::AddGlobalTestEnvironment(new RxeGuest));

// ---------------------------------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------------------------------

// kRdmaCm: the connection is made by rdma_cm (uroce's librdmacm against the guest kernel's rdma_cm, IB CM MADs on
// QP1); kPerftestCm: perftest with -R, its handshake and QPs through rdma_cm.
enum class Family { kPingpong, kPerftest, kVerify, kRdmaCm, kPerftestCm };

struct InteropCase {
  std::string name;
  Family family;
  std::string program;             // on $PATH on both sides, or "rdma_verify"
  std::vector<std::string> args;   // the same on both sides
  std::string client_result;       // a line the client prints on success (regex, whole line)
};

enum class UroceRole { kServer, kClient };

struct InteropParam {
  InteropCase c;
  UroceRole role;
};

std::string CaseName(const InteropParam& p) {
  return p.c.name + (p.role == UroceRole::kServer ? "_UroceServer" : "_UroceClient");
}
std::string ParamName(const ::testing::TestParamInfo<InteropParam>& info) { return CaseName(info.param); }
// gtest prints a failing case's parameter with this, instead of its bytes.
void PrintTo(const InteropParam& p, std::ostream* os) { *os << CaseName(p); }

const std::vector<InteropCase>& Cases() {
  const std::string mtu = std::to_string(kLinkMtu);
  // Pingpongs print "N iters in S seconds = U usec/iter" when every round trip completed (and, with -c, matched).
  const std::string iters = R"(\s*100 iters in [0-9.]+ seconds = [0-9.]+ usec/iter\s*)";
  // perftest's result row: #bytes #iterations and figures.
  const auto row = [](const std::string& bytes, const std::string& iterations) {
    return R"(\s*)" + bytes + R"(\s+)" + iterations + R"(\s+[0-9.]+.*)";
  };
  static const std::vector<InteropCase> cases = {
      {"RcPingpong", Family::kPingpong, "ibv_rc_pingpong", {"-c", "-m", mtu, "-s", "4096", "-n", "100"}, iters},
      {"UcPingpong", Family::kPingpong, "ibv_uc_pingpong", {"-c", "-m", mtu, "-s", "4096", "-n", "100"}, iters},
      // UD: one packet per message, the largest the link carries.
      {"UdPingpong", Family::kPingpong, "ibv_ud_pingpong", {"-c", "-s", mtu, "-n", "100"}, iters},
      // 16 QPs on one SRQ (the default -q).
      {"SrqPingpong", Family::kPingpong, "ibv_srq_pingpong", {"-c", "-m", mtu, "-s", "4096", "-n", "100"}, iters},
      // RC streams with a local ACK timeout of 1 s (-u 18), as RxeHostDeviceTest's: the guest (TCG) stalls longer
      // than perftest's 67 ms x 8 retries when the host is loaded (SendBw's uroce client ended with
      // IBV_WC_RETRY_EXC_ERR after 0.9 s in two runs of the whole suite here, and passed alone).
      {"WriteBw", Family::kPerftest, "ib_write_bw", {"-m", mtu, "-s", "65536", "-n", "200", "-u", "18"},
       row("65536", "200")},
      {"ReadBw", Family::kPerftest, "ib_read_bw", {"-m", mtu, "-s", "65536", "-n", "200", "-u", "18"},
       row("65536", "200")},
      {"SendBw", Family::kPerftest, "ib_send_bw", {"-m", mtu, "-s", "65536", "-n", "200", "-u", "18"},
       row("65536", "200")},
      // The same verbs over the unreliable transports.
      {"WriteBwUc", Family::kPerftest, "ib_write_bw", {"-c", "UC", "-m", mtu, "-s", "65536", "-n", "200"},
       row("65536", "200")},
      // UD may drop, and perftest's UD server waits for every message: it posts all 1000 receives before the first
      // arrives (-r), so that a receiver slower than the sender (the emulated guest, by far) is never without one.
      {"SendBwUd", Family::kPerftest, "ib_send_bw", {"-c", "UD", "-m", mtu, "-s", mtu, "-n", "1000", "-r", "1000"},
       row(mtu, "1000")},
      {"AtomicBw", Family::kPerftest, "ib_atomic_bw", {"-m", mtu, "-n", "200"}, row("8", "200")},
      {"SendLat", Family::kPerftest, "ib_send_lat", {"-m", mtu, "-s", "64", "-n", "200"}, row("64", "200")},
      // Each side polls its buffer for the peer's WRITE.
      {"WriteLat", Family::kPerftest, "ib_write_lat", {"-m", mtu, "-s", "64", "-n", "200"}, row("64", "200")},
      // Random WRITE / READ / FETCH_AND_ADD / CMP_AND_SWAP, every byte and every atomic result checked.
      {"RdmaVerify", Family::kVerify, "/usr/local/bin/rdma_verify", {"--mtu=" + mtu, "--ops=300", "--seed=7"},
       R"(rdma_verify client: OK ops=300 .* mismatches=0 server_mismatched_bytes=0 .*)"},
      // rdma_cm: SEND + RDMA READ + RDMA WRITE per ping, checked (-V); connections from one event channel; UD via
      // SIDR; perftest with its handshake over rdma_cm.
      {"RpingCm", Family::kRdmaCm, "rping", {}, R"(ping data: rdma-ping-9: .*)"},
      {"UcmatoseCm", Family::kRdmaCm, "ucmatose", {}, R"(return status 0\s*)"},
      {"UdaddyCm", Family::kRdmaCm, "udaddy", {}, R"(return status 0\s*)"},
      {"SendBwCm", Family::kPerftestCm, "ib_send_bw", {"-s", "65536", "-n", "200"}, row("65536", "200")},
      {"WriteBwCm", Family::kPerftestCm, "ib_write_bw", {"-s", "65536", "-n", "200"}, row("65536", "200")},
      {"ReadBwCm", Family::kPerftestCm, "ib_read_bw", {"-s", "65536", "-n", "200"}, row("65536", "200")},
  };
  return cases;
}

std::vector<InteropParam> Params() {
  std::vector<InteropParam> out;
  for (const InteropCase& c : Cases()) {
    for (UroceRole role : {UroceRole::kServer, UroceRole::kClient}) out.push_back({c, role});
  }
  return out;
}

// Whether UDP kHostAddr:4791 can be bound, waiting up to `wait` for it. The previous case's uroce process may hold
// it for a moment after it was reaped: io_uring releases a ring's files from a kernel worker once the process has
// exited, so its socket closes a little later.
bool RoceV2PortFreeWithin(std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (true) {
    const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(wire::kRoceV2UdpPort);
    inet_pton(AF_INET, kHostAddr, &sa.sin_addr);
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    close(fd);
    if (free || std::chrono::steady_clock::now() >= deadline) return free;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

class RxeInteropTest : public ClientTest, public ::testing::WithParamInterface<InteropParam> {
 protected:
  void SetUp() override {
    if (!g_guest->skip_reason().empty()) GTEST_SKIP() << g_guest->skip_reason();
    ASSERT_TRUE(g_guest->failure().empty()) << g_guest->failure();
    ClientTest::SetUp();
    env_.emplace_back("UROCE_ADDR", kHostAddr);
    env_.emplace_back("UROCE_MTU", std::to_string(kLinkMtu));
    env_.emplace_back("UROCE_STATS", "1");  // the device's counters (drops by reason) in every failure message
  }

  // The argv of one side. `on_guest`: rxe0 with its RoCEv2 GID at index 1; else uroce0, GID index 0.
  static std::vector<std::string> Argv(const InteropCase& c, const std::string& program, bool on_guest, bool server,
                                       int port) {
    const std::string dev = on_guest ? "rxe0" : "uroce0";
    const std::string gid = on_guest ? "1" : "0";
    const std::string peer = on_guest ? kHostAddr : kGuestAddr;
    std::vector<std::string> argv = {program};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    switch (c.family) {
      case Family::kPingpong:
        argv.insert(argv.end(), {"-d", dev, "-g", gid, "-p", std::to_string(port)});
        if (!server) argv.push_back(peer);
        break;
      case Family::kPerftest:
        argv.insert(argv.end(), {"-d", dev, "-x", gid, "-p", std::to_string(port), "-F"});
        if (!server) argv.push_back(peer);
        break;
      case Family::kVerify:
        argv.insert(argv.end(), {"--dev=" + dev, "--gid-index=" + gid, "--port=" + std::to_string(port),
                                 server ? "--role=server" : "--role=client"});
        if (!server) argv.push_back("--host=" + peer);
        break;
      case Family::kRdmaCm: {
        // The address comes from rdma_cm: a server binds its own (rping) or any; a client dials the peer's.
        const std::string self = on_guest ? kGuestAddr : kHostAddr;
        if (c.program == "rping") {
          argv.insert(argv.end(), {server ? "-s" : "-c", "-a", server ? self : peer, "-C", "10", "-v"});
          if (!server) argv.push_back("-V");
        } else if (!server) {
          argv.insert(argv.end(), {"-s", peer});
        }
        if (c.program != "udaddy") argv.insert(argv.end(), {"-p", std::to_string(port)});  // udaddy: 7174 always
        break;
      }
      case Family::kPerftestCm:
        argv.insert(argv.end(), {"-d", dev, "-x", gid, "-p", std::to_string(port), "-F", "-R"});
        if (!server) argv.push_back(peer);
        break;
    }
    return argv;
  }

  // The port a case's server listens on: udaddy has no option for it.
  static int ServerPort(const InteropCase& c, int port) { return c.program == "udaddy" ? 7174 : port; }
  static uint16_t PortSpace(const InteropCase& c) {
    return c.program == "udaddy" ? wire::kPortSpaceUdp : wire::kPortSpaceTcp;
  }
};

TEST_P(RxeInteropTest, PairCompletesWithDataChecked) {
  const InteropCase& c = GetParam().c;
  const bool uroce_server = GetParam().role == UroceRole::kServer;
  std::string host_program = c.program;
  if (c.family == Family::kVerify) {
    host_program = Runfile("tests/rdma_verify");
    ASSERT_FALSE(host_program.empty()) << "tests/rdma_verify is not in the runfiles";
  } else {
    host_program = Program(c.program);
    if (host_program.empty()) return;
  }
  int port = Port();
  // A port free on this host may be taken in the guest, whose ephemeral ports come from the same range: a guest
  // server once could not listen ("Couldn't listen to port") and the pair failed. A guest server gets one free there.
  for (int tries = 0; !uroce_server && port > 0 && tries < 5 && g_guest->GuestPortInUse(port); ++tries) port = Port();
  ASSERT_GT(port, 0);
  ASSERT_TRUE(RoceV2PortFreeWithin(std::chrono::seconds(5))) << "UDP " << kHostAddr << ":4791 is still in use";
  const std::vector<std::string> host_argv = Argv(c, host_program, false, uroce_server, port);
  std::string guest_command;
  for (const std::string& a : Argv(c, c.program, true, !uroce_server, port)) {
    guest_command += (guest_command.empty() ? "" : " ") + a;
  }
  const auto start_host = [&]() -> std::unique_ptr<StartedProgram> {
    return std::make_unique<Process>(Process::Start(host_argv, env_));
  };
  const auto start_guest = [&]() -> std::unique_ptr<StartedProgram> {
    return std::make_unique<GuestCommand>(g_guest->cmd_port(), guest_command);
  };

  const bool cm = c.family == Family::kRdmaCm || c.family == Family::kPerftestCm;
  const int listen_port = ServerPort(c, port);
  const auto host_listening = [&] {
    return cm ? rdmacm::FindPortOwner(PortSpace(c), static_cast<uint16_t>(listen_port)).has_value()
              : TcpPortListening(port);
  };
  const auto guest_listening = [&] {
    return cm ? g_guest->GuestCmListening(listen_port) : g_guest->GuestListening(port);
  };
  const PairResult r = uroce_server ? RunStartedPair(start_host, host_listening, start_guest, kPairTimeout)
                                    : RunStartedPair(start_guest, guest_listening, start_host, kPairTimeout);
  if (!r.Succeeded()) g_guest->KillAll(c.program.substr(c.program.rfind('/') + 1));
  ASSERT_TRUE(r.Succeeded()) << r.Describe();
  // uroce's counters (UROCE_STATS=1): every ICRC from rxe was good. rxe sends changing IPv4 IDs, which the socket
  // never shows, so each was verified with the ID solved for. (A UC/UD sender receives nothing: rx_packets 0.)
  const std::string& host_output = uroce_server ? r.server.output : r.client.output;
  const std::vector<std::string> rx = MatchLine(host_output, std::regex(R"(rx_packets ([0-9]+)\s*)"));
  ASSERT_FALSE(rx.empty()) << "no device counters from uroce\n" << r.Describe();
  EXPECT_TRUE(HasLine(host_output, R"(rx_icrc_errors 0\s*)")) << r.Describe();
  if (rx[1] != "0") {
    EXPECT_TRUE(HasLine(host_output, R"(rx_icrc_ip_id_inferred [1-9][0-9]*\s*)")) << r.Describe();
  }
  EXPECT_FALSE(MatchLine(r.client.output, std::regex(c.client_result)).empty())
      << "no line matching " << c.client_result << " from the client\n"
      << r.Describe();
  if (c.family == Family::kPingpong || (cm && c.program != "rping")) {
    // The server prints the same summary: its side completed every round trip too.
    EXPECT_FALSE(MatchLine(r.server.output, std::regex(c.client_result)).empty()) << r.Describe();
  }
  if (c.family == Family::kVerify) {
    EXPECT_TRUE(HasLine(r.server.output, R"(rdma_verify server: buffer [0-9]+ bytes, mismatched bytes 0\s*)"))
        << r.Describe();
  }
  std::cout << c.name << (uroce_server ? " uroce server: " : " uroce client: ") << "client "
            << r.client.elapsed.count() << " ms, server " << r.server.elapsed.count() << " ms\n";
}

INSTANTIATE_TEST_SUITE_P(KernelRxe, RxeInteropTest, ::testing::ValuesIn(Params()), ParamName);

// Kernel rxe talking at once to 4 uroce processes that share the host side's one address: the host device
// (UROCE_DEVICE=host), whose service holds UDP 4791 of kHostAddr and hands each of rxe's packets to the process that
// owns its destination QP. Each pair is rdma_verify (random WRITE / READ / atomics, every byte and result checked),
// with a local ACK timeout of 1 s (--qp-timeout=18): four pairs at once in the emulated guest (TCG) answer slowly,
// and ibv_rc_pingpong's fixed 67 ms x 8 retries failed there under load.
class RxeHostDeviceTest : public ClientTest {
 protected:
  void SetUp() override {
    if (!g_guest->skip_reason().empty()) GTEST_SKIP() << g_guest->skip_reason();
    ASSERT_TRUE(g_guest->failure().empty()) << g_guest->failure();
    ClientTest::SetUp();
    env_.emplace_back("UROCE_DEVICE", "host");
    env_.emplace_back("UROCE_ADDR", kHostAddr);
    env_.emplace_back("UROCE_MTU", std::to_string(kLinkMtu));
    env_.emplace_back("UROCE_STATS", "1");
  }
};

TEST_F(RxeHostDeviceTest, FourProcessesOnTheHostsOneAddressTalkToRxeAtOnce) {
  const std::string verify = Runfile("tests/rdma_verify");
  ASSERT_FALSE(verify.empty()) << "tests/rdma_verify is not in the runfiles";
  ASSERT_TRUE(RoceV2PortFreeWithin(std::chrono::seconds(5))) << "UDP " << kHostAddr << ":4791 is still in use";
  constexpr int kPairs = 4;
  const std::string mtu = "--mtu=" + std::to_string(kLinkMtu);
  std::vector<int> ports;
  for (int i = 0; i < kPairs; ++i) ports.push_back(Port());
  std::vector<PairResult> results(kPairs);
  std::vector<std::thread> pairs;
  for (int i = 0; i < kPairs; ++i) {
    pairs.emplace_back([&, i] {
      const std::string port = "--port=" + std::to_string(ports[size_t(i)]);
      const std::vector<std::string> host_argv = {verify, mtu, "--dev=uroce0", "--gid-index=0", port,
                                                  "--role=server", "--qp-timeout=18"};
      const std::string guest_command = "/usr/local/bin/rdma_verify " + mtu + " --ops=200 --seed=" +
                                        std::to_string(i + 1) + " --dev=rxe0 --gid-index=1 " + port +
                                        " --role=client --qp-timeout=18 --host=" + kHostAddr;
      results[size_t(i)] = RunStartedPair(
          [&] { return std::make_unique<Process>(Process::Start(host_argv, env_)); },
          [&, i] { return TcpPortListening(ports[size_t(i)]); },
          [&] { return std::make_unique<GuestCommand>(g_guest->cmd_port(), guest_command); }, kPairTimeout);
    });
  }
  for (std::thread& t : pairs) t.join();
  std::set<std::string> owners;
  for (int i = 0; i < kPairs; ++i) {
    const PairResult& r = results[size_t(i)];
    EXPECT_TRUE(r.Succeeded()) << "pair " << i << ": " << r.Describe();
    EXPECT_TRUE(HasLine(r.client.output, R"(rdma_verify client: OK ops=200 .* mismatches=0 server_mismatched_bytes=0 .*)"))
        << r.Describe();
    EXPECT_TRUE(HasLine(r.server.output, R"(rdma_verify server: buffer [0-9]+ bytes, mismatched bytes 0\s*)"))
        << r.Describe();
    // Each is a process of the host device on the one address, with an owner number of its own.
    EXPECT_TRUE(HasLine(r.server.output,
                        std::string(R"(uroce: counters of uroce0 at )") + kHostAddr + R"( \(host device transport\)\s*)"))
        << r.Describe();
    const auto owner = MatchLine(r.server.output, std::regex(R"(host_device_owner ([0-9]+)\s*)"));
    ASSERT_FALSE(owner.empty()) << r.Describe();
    owners.insert(owner[1]);
  }
  EXPECT_EQ(owners.size(), size_t(kPairs)) << "the 4 processes should have 4 owner numbers";
  if (HasFailure()) g_guest->KillAll("rdma_verify");
}

}  // namespace
}  // namespace uroce::tests
