#include "verbs_api/engine.h"

#include "verbs_api/device_tree.h"
#include "verbs_api/time_scale.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <vector>

#include "wire/clock.h"
#include "wire/host_addresses.h"
#include "wire/icrc.h"
#include "wire/capture_transport.h"
#include "wire/fault_model.h"
#include "wire/fault_transport.h"
#include "wire/pcap.h"
#include "wire/socket_transport.h"
#include "wire/udp_socket.h"
#include "wire/uring_transport.h"

namespace uroce::verbs {
namespace {

std::mutex g_engine_mu;
std::weak_ptr<Engine> g_engine;
bool g_exit_handler_registered = false;  // guarded by g_engine_mu; false again in a fork's child

std::string Trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  const auto e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

int ApplySetting(EngineConfig* c, const std::string& key, const std::string& value, std::string* error) {
  if (key == "address") {
    const auto slash = value.find('/');
    auto a = wire::IpAddress::Parse(value.substr(0, slash));
    if (!a) return *error = "bad address '" + value + "'", EINVAL;
    c->address = *a;
    c->address_prefix_len.reset();
    if (slash != std::string::npos) {
      char* end = nullptr;
      const long n = std::strtol(value.c_str() + slash + 1, &end, 10);
      if (*end != '\0' || end == value.c_str() + slash + 1 || n < 0 || n > (a->is_v4() ? 32 : 128))
        return *error = "bad prefix length in '" + value + "'", EINVAL;
      c->address_prefix_len = int(a->is_v4() ? n + 96 : n);  // over the 128 bits of the IPv4-mapped form
    }
  } else if (key == "port") {
    char* end = nullptr;
    const long p = std::strtol(value.c_str(), &end, 10);
    if (*end != '\0' || p <= 0 || p > 65535) return *error = "bad port '" + value + "'", EINVAL;
    c->port = static_cast<uint16_t>(p);
  } else if (key == "mtu") {
    const int m = std::atoi(value.c_str());
    switch (m) {
      case 256: c->mtu = emu::Mtu::k256; break;
      case 512: c->mtu = emu::Mtu::k512; break;
      case 1024: c->mtu = emu::Mtu::k1024; break;
      case 2048: c->mtu = emu::Mtu::k2048; break;
      case 4096: c->mtu = emu::Mtu::k4096; break;
      default: return *error = "bad mtu '" + value + "' (256, 512, 1024, 2048 or 4096)", EINVAL;
    }
    c->mtu_set = true;
  } else if (key == "pcap") {
    c->pcap_path = value;
  } else if (key == "faults") {
    c->faults = value;
  } else if (key == "stats") {
    c->stats = value == "1" || value == "yes" || value == "true";
  } else if (key == "retry_forever") {
    c->retry_forever = value == "1" || value == "yes" || value == "true";
  } else if (key == "trace") {
    c->trace = value == "1" || value == "yes" || value == "true";
  } else if (key == "one_packet_per_datagram") {
    c->one_packet_per_datagram = value == "1" || value == "yes" || value == "true";
  } else if (key == "device") {
    if (value == "host" || value == "process") {
      c->host_device = value == "host";
      c->device_chosen = true;
    } else if (value.empty()) {
      c->host_device = true;
      c->device_chosen = false;
    } else {
      return *error = "bad device '" + value + "' (host or process)", EINVAL;
    }
  } else if (key == "same_host") {
    if (value == "shm" || value.empty()) {
      c->same_host = wire::SameHostPath::kSharedMemory;
    } else if (value == "unix") {
      c->same_host = wire::SameHostPath::kUnixSocket;
    } else if (value == "udp") {
      c->same_host = wire::SameHostPath::kUdp;
    } else {
      return *error = "bad same-host path '" + value + "' (shm, unix or udp)", EINVAL;
    }
  } else if (key == "direct") {
    c->direct = !(value == "0" || value == "no" || value == "false");
  } else if (key == "transport") {
    if (value == "uring" || value == "io_uring") {
      c->transport = TransportChoice::kUring;
    } else if (value == "socket") {
      c->transport = TransportChoice::kSocket;
    } else if (value == "auto" || value.empty()) {
      c->transport = TransportChoice::kAuto;
    } else {
      return *error = "bad transport '" + value + "' (uring or socket)", EINVAL;
    }
  } else {
    return *error = "unknown setting '" + key + "'", EINVAL;
  }
  return 0;
}

// The embedded default's candidate addresses: 127.0.0.1-254, 127.0.1.1-254, ..., 127.0.255.1-254. All of
// 127.0.0.0/8 is the host's loopback (RFC 1122 3.2.1.3; Linux routes it to lo), so every process of a machine can
// have its own address and the RoCEv2 port. Host parts 0 and 255 are skipped (they look like network and broadcast
// addresses to tools that assume a /24). The scan stops at 127.0.255.254: 65,024 processes, and a bounded time
// (well under a second) to report that none is free when another program holds the port on all addresses.
constexpr uint32_t kLoopbackCandidates = 256 * 254;
wire::IpAddress LoopbackCandidate(uint32_t i) { return wire::IpAddress::V4(0x7f000000u | (i / 254) << 8 | (i % 254 + 1)); }

// The addresses a device may take, in the order they are tried.
struct Candidates {
  uint32_t count = 0;
  std::function<wire::IpAddress(uint32_t)> at;
  std::string description;  // for "no free address in ..."
};

Candidates LoopbackCandidates() {
  return {kLoopbackCandidates, LoopbackCandidate,
          LoopbackCandidate(0).ToString() + "-" + LoopbackCandidate(kLoopbackCandidates - 1).ToString()};
}

// The active MTU of a port on the interface that holds `address`, as rxe derives it from its netdev: the largest IB
// MTU whose packets fit the interface's MTU with their headers (IP, UDP, BTH, the largest extension headers a full
// packet carries: XRCETH + RETH + ImmDt, ICRC), at most 4096. A 1500-byte Ethernet link gives 1024 (rxe reports the
// same), a 9000-byte one or loopback 4096. A packet larger than the link's MTU cannot leave at all (DF): an RC QP
// whose path MTU came from a 4096 default on a 1500-byte veth ended every connection with RETRY_EXC_ERR.
emu::Mtu MtuForInterfaceOf(const wire::IpAddress& address) {
  const Netdev netdev = NetdevOf(address);
  if (netdev.name.empty()) return emu::Mtu::k4096;
  ifreq req{};
  std::strncpy(req.ifr_name, netdev.name.c_str(), IFNAMSIZ - 1);
  // The kernel's socket, never socket(3): under librspreload that would be an rsocket over the device now starting.
  const int fd = wire::OpenKernelUdpSocket(AF_INET);
  const bool known = fd >= 0 && ioctl(fd, SIOCGIFMTU, &req) == 0;
  if (fd >= 0) close(fd);
  if (!known) return emu::Mtu::k4096;
  const int headers = (address.is_v4() ? 20 : 40) + 8 + 12 + 4 + 16 + 4 + 4;  // IP UDP BTH XRCETH RETH ImmDt ICRC
  for (emu::Mtu m : {emu::Mtu::k4096, emu::Mtu::k2048, emu::Mtu::k1024, emu::Mtu::k512}) {
    if (int(emu::MtuBytes(m)) + headers <= req.ifr_mtu) return m;
  }
  return emu::Mtu::k256;
}

// This host's addresses inside prefix/len (len over the 128 bits of the IPv4-mapped form), lowest first.
Candidates HostAddressesIn(const wire::IpAddress& prefix, int len) {
  auto inside = [&](const wire::IpAddress& a) {
    for (int bit = 0; bit < len; ++bit) {
      const int byte = bit / 8, mask = 0x80 >> (bit % 8);
      if ((a.bytes()[byte] & mask) != (prefix.bytes()[byte] & mask)) return false;
    }
    return true;
  };
  std::vector<wire::IpAddress> found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
      if (const auto a = wire::IpAddressOf(i->ifa_addr); a && inside(*a)) found.push_back(*a);
    }
    freeifaddrs(list);
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  const std::string description =
      prefix.ToString() + "/" + std::to_string(prefix.is_v4() ? len - 96 : len) + " (this host's addresses there)";
  return {uint32_t(found.size()), [found](uint32_t i) { return found[i]; }, description};
}

// The index of the first candidate from `from` whose address has `port` free, or -errno (-EADDRINUSE when none
// has). Probes with bind(2) on a bare socket, which a failed bind leaves unbound for the next try: a few
// microseconds per address, where creating a transport per address costs ten times that.
int NextFreeCandidate(const Candidates& candidates, uint32_t from, uint16_t port) {
  int fds[2] = {-1, -1};  // IPv4, IPv6: made when first needed
  int result = -EADDRINUSE;
  for (uint32_t i = from; i < candidates.count; ++i) {
    const wire::IpAddress a = candidates.at(i);
    int& fd = fds[a.is_v4() ? 0 : 1];
    if (fd < 0 && (fd = wire::OpenKernelUdpSocket(a.is_v4() ? AF_INET : AF_INET6)) < 0) {
      result = -errno;
      break;
    }
    sockaddr_storage sa;
    socklen_t len;
    if (int r = wire::ToSockaddr({a, port}, a.is_v4() ? AF_INET : AF_INET6, &sa, &len); r < 0) {
      result = r;
      break;
    }
    if (bind(fd, reinterpret_cast<sockaddr*>(&sa), len) == 0) {
      result = int(i);
      break;
    }
    if (errno != EADDRINUSE) {
      result = -errno;
      break;
    }
  }
  for (int fd : fds)
    if (fd >= 0) close(fd);
  return result;
}

std::atomic<bool> g_uring_refused{false};

// io_uring_setup(2)'s refusals that plain sockets do not share: EPERM (seccomp profiles of Docker >= 25 and
// containerd 2.0, kernel.io_uring_disabled, io_uring_group), ENOSYS (no CONFIG_IO_URING, gVisor), ENOMEM (ring
// memory is charged to the user's RLIMIT_MEMLOCK without CAP_IPC_LOCK, e.g. in a user namespace: 8 MiB is ~100
// processes' rings).
// io_uring_setup refused (EPERM: seccomp, kernel.io_uring_disabled; ENOSYS; ENOMEM: RLIMIT_MEMLOCK), or a kernel whose
// io_uring lacks what the transport needs (EOPNOTSUPP: no IORING_SETUP_CQSIZE before Linux 5.5).
bool UringRefused(int rc) { return rc == -EPERM || rc == -ENOSYS || rc == -ENOMEM || rc == -EOPNOTSUPP; }

// Opens the transport *choice names on `ep`. kAuto tries io_uring first and, when it is refused, switches *choice
// to kSocket for the rest of the process and says so once. Returns 0 or -errno (-EADDRINUSE: try another address);
// *reported tells that the error has been printed.
int OpenTransport(TransportChoice* choice, const wire::UdpEndpoint& ep, bool udp_offloads,
                  std::unique_ptr<wire::Transport>* out, bool* reported) {
  if (*choice == TransportChoice::kAuto && g_uring_refused.load()) *choice = TransportChoice::kSocket;
  if (*choice != TransportChoice::kSocket) {
    std::unique_ptr<wire::UringTransport> uring;
    wire::UringTransport::Options options;
    options.responses_first = true;  // completions in a hardware's order (wire::DeliverReceived)
    options.udp_offloads = udp_offloads;
    const int rc = wire::UringTransport::Create(ep, options, &uring);
    if (rc == 0) {
      *choice = TransportChoice::kUring;
      *out = std::move(uring);
      return 0;
    }
    if (!UringRefused(rc)) return rc;
    if (*choice == TransportChoice::kUring) {
      fprintf(stderr, "uroce: UROCE_TRANSPORT=uring, but io_uring is refused here: %s\n", strerror(-rc));
      *reported = true;
      return rc;
    }
    if (!g_uring_refused.exchange(true)) {
      fprintf(stderr,
              "uroce: io_uring is refused here (%s%s); using plain UDP sockets (recvmmsg/sendmmsg + poll). "
              "UROCE_TRANSPORT=socket skips the attempt\n",
              strerror(-rc), rc == -ENOMEM ? ": ring memory beyond RLIMIT_MEMLOCK, see ulimit -l" : "");
    }
    *choice = TransportChoice::kSocket;
  }
  std::unique_ptr<wire::SocketTransport> socket;
  wire::SocketTransport::Options options;
  options.responses_first = true;
  options.udp_offloads = udp_offloads;
  const int rc = wire::SocketTransport::Create(ep, options, &socket);
  if (rc == 0) *out = std::move(socket);
  return rc;
}

// The child of a fork() has no progress thread: the parent's engine must not be used (or destroyed) there. A new
// ibv_open_device in the child starts a fresh engine on a new address.
void ForgetEngineInChild() {
  // Keep the inherited engine alive forever: its destructor would join a thread that does not exist here. (Held
  // from a global, so that a leak checker at the child's exit sees it reachable.)
  static auto* inherited_engines = new std::vector<std::shared_ptr<Engine>>;
  if (auto inherited = g_engine.lock()) inherited_engines->push_back(std::move(inherited));
  g_engine.reset();
  g_exit_handler_registered = false;
}

}  // namespace

int LoadEngineConfig(EngineConfig* config, std::string* error) {
  const char* file = std::getenv("UROCE_CONFIG");
  const std::string path = file ? file : "/etc/uroce.conf";
  errno = 0;
  std::ifstream in(path);
  if (file && !in) {
    const int err = errno != 0 ? errno : EINVAL;
    return *error = "cannot read UROCE_CONFIG=" + path + ": " + strerror(err), err;
  }
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    line = Trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    const auto eq = line.find('=');
    if (eq == std::string::npos) return *error = where + "line without '=': " + line, EINVAL;
    if (int err = ApplySetting(config, Trim(line.substr(0, eq)), Trim(line.substr(eq + 1)), error)) {
      *error = where + *error;
      return err;
    }
  }
  static const char* kKeys[] = {"address", "port",          "mtu",       "pcap",
                                "faults",  "stats",         "retry_forever", "transport",
                                "one_packet_per_datagram", "trace", "device", "same_host", "direct"};
  for (const char* key : kKeys) {
    std::string env = "UROCE_";
    for (const char* k = key; *k; ++k) env += static_cast<char>(std::toupper(static_cast<unsigned char>(*k)));
    if (env == "UROCE_ADDRESS") env = "UROCE_ADDR";
    if (const char* v = std::getenv(env.c_str())) {
      if (int err = ApplySetting(config, key, v, error)) {
        *error = env + ": " + *error;
        return err;
      }
    }
  }
  return 0;
}

uint64_t NodeGuid() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the host name
  for (const char* p = host; *p; ++p) h = (h ^ static_cast<uint8_t>(*p)) * 1099511628211ull;
  // A locally administered EUI-64 (U/L bit set in the first byte), never 0.
  return (h & 0x00ffffffffffffffull) | 0x0200000000000000ull;
}

std::shared_ptr<Engine> Engine::Acquire() {
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, ForgetEngineInChild); });
  std::shared_ptr<Engine> e;
  {
    std::lock_guard lock(g_engine_mu);
    if (auto running = g_engine.lock()) return running;
    EngineConfig config;
    std::string error;
    if (int err = LoadEngineConfig(&config, &error)) {
      fprintf(stderr, "uroce: %s\n", error.c_str());
      errno = err;
      return nullptr;
    }
    e.reset(new Engine());
    if (int err = e->Start(config)) {
      errno = err;
      return nullptr;
    }
    g_engine = e;
  }
  // The discovery shim's files of this process, made now if they were not (the live counters go there), with GID 0
  // now that it is known. Outside g_engine_mu: the shim writes them through WriteDeviceTree, which takes it.
  RefreshDeviceTree(e->device().gids().Populated(), e->membership() != nullptr);
  e->WriteLiveCounters(wire::SystemClock::Instance().NowNs());
  return e;
}

std::shared_ptr<Engine> Engine::Running() {
  std::lock_guard lock(g_engine_mu);
  return g_engine.lock();
}

int Engine::Start(const EngineConfig& config) {
  wire::IpAddress bound;
  int rc;
  bool reported = false;
  TransportChoice choice = config.transport;
  const bool offloads = !config.one_packet_per_datagram;
  bool own_device = !config.host_device;
  if (config.host_device) {
    rc = StartOnHostDevice(config, &bound);
    reported = true;
    if (rc < 0 && !config.device_chosen) {
      // The host device is only the default: a device of our own still lets this process work (it reaches the host's
      // other processes over UDP, as one on another host would).
      fprintf(stderr, "uroce: this process takes a device of its own instead (UROCE_DEVICE=host insists on sharing)\n");
      udp_counters_ = nullptr;
      own_device = true;
      reported = false;
    }
  }
  if (own_device && config.address && !config.address_prefix_len) {
    bound = *config.address;
    // A process that had this address a moment ago may still hold its socket: io_uring drops it from a kernel worker
    // after the process has gone, and the next program on the same UROCE_ADDR, started at once, failed with
    // EADDRINUSE. Taken for longer than kBindRetryNs, it is another program's.
    const uint64_t give_up = wire::SystemClock::Instance().NowNs() + kBindRetryNs;
    while ((rc = OpenTransport(&choice, {bound, config.port}, offloads, &transport_, &reported)) == -EADDRINUSE &&
           wire::SystemClock::Instance().NowNs() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (rc < 0 && !reported) {
      fprintf(stderr, "uroce: cannot bind %s: %s\n", wire::UdpEndpoint{bound, config.port}.ToString().c_str(),
              strerror(-rc));
    }
  } else if (own_device) {
    // The first free of several: loopback addresses, so that processes with devices of their own on one machine
    // reach each other with no address set, or this host's addresses in UROCE_ADDR's prefix.
    const Candidates candidates = config.address ? HostAddressesIn(*config.address, *config.address_prefix_len)
                                                 : LoopbackCandidates();
    rc = -EADDRINUSE;
    for (int i = 0; rc == -EADDRINUSE; ++i) {
      i = NextFreeCandidate(candidates, uint32_t(i), config.port);
      if (i < 0) {
        rc = i;
        break;
      }
      bound = candidates.at(uint32_t(i));
      // -EADDRINUSE if another process won the race
      rc = OpenTransport(&choice, {bound, config.port}, offloads, &transport_, &reported);
    }
    if (rc == -EADDRINUSE) {
      fprintf(stderr,
              "uroce: no free address in %s on UDP port %u (held on all addresses by another program, such as "
              "kernel rxe? UROCE_PORT or UROCE_ADDR choose another)\n",
              candidates.description.c_str(), config.port);
    } else if (rc < 0 && !reported) {
      fprintf(stderr, "uroce: cannot bind %s: %s\n", wire::UdpEndpoint{bound, config.port}.ToString().c_str(),
              strerror(-rc));
    }
  }
  if (rc < 0) return -rc;
  transport_name_ = membership_ ? "host device" : choice == TransportChoice::kSocket ? "socket" : "io_uring";
  if (auto* uring = dynamic_cast<wire::UringTransport*>(transport_.get())) {
    udp_counters_ = [uring] { return uring->counters(); };
  } else if (auto* socket = dynamic_cast<wire::SocketTransport*>(transport_.get())) {
    udp_counters_ = [socket] { return socket->counters(); };
  }
  // Decorators, innermost first: faults act on what leaves and arrives; the capture records what the HCA sent and
  // what it was handed, so a dropped packet shows in the sender's capture and not in the receiver's.
  if (!config.faults.empty()) {
    std::string error;
    auto faults = wire::FaultConfig::Parse(config.faults, &error);
    if (!faults) {
      fprintf(stderr, "uroce: bad UROCE_FAULTS '%s': %s\n", config.faults.c_str(), error.c_str());
      return EINVAL;
    }
    auto faulty = std::make_unique<wire::FaultInjectingTransport>(std::move(transport_), wire::SystemClock::Instance(),
                                                                  *faults, *faults);
    faults_ = faulty.get();
    transport_ = std::move(faulty);
  }
  if (!config.pcap_path.empty()) {
    pcap_ = std::make_unique<wire::PcapWriter>();
    if (int rc = pcap_->Open(config.pcap_path); rc < 0) {
      fprintf(stderr, "uroce: cannot write UROCE_PCAP=%s: %s\n", config.pcap_path.c_str(), strerror(-rc));
      return -rc;
    }
    transport_ = std::make_unique<wire::CaptureTransport>(std::move(transport_), *pcap_, wire::SystemClock::Instance());
  }
  emu::DeviceConfig dc;
  dc.address = bound;
  dc.active_mtu = config.mtu_set ? config.mtu : MtuForInterfaceOf(bound);
  dc.node_guid = NodeGuid();
  dc.retry_cnt_7_infinite = config.retry_forever;
  if (membership_) dc.owner = membership_->owner();
  // XRC SRQs shared with the host's other processes replace no packet: on whatever watches them.
  // So do PDs and regions offered for import (ibv_import_pd(3), ibv_import_mr(3) by a process given our cmd_fd).
  if (host_transport_ != nullptr && host_transport_->ShareXrcSrqs() == 0) {
    dc.shared_xrc = host_transport_;
    dc.exports = host_transport_;
  }
  // Direct access needs the packets it replaces to be nothing anybody watches or alters.
  if (host_transport_ != nullptr && config.direct && faults_ == nullptr && pcap_ == nullptr &&
      host_transport_->EnableDirectAccess() == 0) {
    dc.direct = host_transport_;
    // Nor does anyone read the ICRC of what goes to another process of the host: it is not computed.
    host_transport_->LeaveUnreadIcrcsUnsealed();
  }
  if (config.trace) {
    // The protocol's decisions, one line each, as they happen (stderr is unbuffered: lines from several threads
    // never mix within a line).
    dc.trace = [](std::string_view line) {
      fprintf(stderr, "uroce: trace: %.*s\n", static_cast<int>(line.size()), line.data());
    };
  }
  std::random_device entropy;
  dc.id_seed = (uint64_t{entropy()} << 32 | entropy()) | 1;  // never 0: keys, QPNs and comm IDs differ by run
  // On a machine that runs slower than the thresholds assume (an emulator), they stretch with it.
  time_scale_ = MeasureTimeScale();
  // The CRC's implementation is chosen by timing at the first CRC (wire/icrc.h): ~1 ms under TCG, which landed in
  // the first round trip of a ping-pong on each side. A device that is opened will send.
  {
    const uint8_t byte = 0;
    (void)wire::Crc32(0, &byte, 1);
  }
  dc.time_scale = time_scale_;
  device_ = std::make_unique<emu::Device>(dc, *transport_, wire::BatchedClock::Instance());
  if (membership_ && membership_->every_address()) {
    std::unique_ptr<wire::SharedGidTable> table;
    const int fd = membership_->TakeGidTableFd();
    int rc = fd < 0 ? -ENOENT : wire::SharedGidTable::Attach(fd, &table);
    if (fd >= 0) close(fd);
    if (rc == 0) {
      rc = -gid_follower_.Start(std::move(table), [this](const wire::SharedGidTable::Entries& e, bool announce) {
        ApplyGids(e, announce);
      });
    }
    if (rc != 0) {
      fprintf(stderr, "uroce: cannot follow the host's GID table (%s): uroce0 lists GID 0 alone\n", strerror(-rc));
    }
  }
  // Received requests' ACKs are held a little (Device::AckTiming::kHeld): whoever receives, the application may
  // answer at once, and its reply then leaves first with the ACK behind it.
  handler_ = [this, dev = device_.get()](const wire::InDatagram& d) {
    if (d.record == wire::RingRecord::kPacket) lease_length_.OnPacket();
    dev->OnDatagram(d, emu::Device::AckTiming::kHeld);
  };
  lease_timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);  // wire::SystemClock's clock
  if (lease_timer_fd_ < 0) {
    const int err = errno;
    fprintf(stderr, "uroce: timerfd_create: %s\n", strerror(err));
    return err;
  }
  poll_pattern_.SetTimeScale(time_scale_);
  spin_ns_ = Scaled(kSpinNs);
  app_polling_ns_ = Scaled(kAppPollingNs);
  // In a TCG guest an epoll_wait cost several microseconds: unstretched, a look every 20 us was a tenth of a spinning
  // application's time there.
  if (host_transport_ != nullptr) host_transport_->StretchSocketLooks(time_scale_);
  lease_length_.SetTimeScale(time_scale_);  // the lease only where no packet comes (LeaseLength)
  receive_after_send_ns_ = Scaled(kReceiveAfterSendNs);
  keeps_posting_ns_ = Scaled(PollPattern::kThinkNs / 2);
  yield_when_idle_ = time_scale_ >= PollPattern::kEmulatedScale;
  progress_ = std::thread([this] { ProgressLoop(); });
  stats_ = config.stats;
  // A program may exit without closing the device: the ACKs still held leave (its peer's last messages would be
  // retried until they fail otherwise), the counters are printed then too, and the threads that write into
  // registered memory stop. The destructors that run after this handler -- of objects made before the device was
  // opened, a program's global buffers among them -- may free memory still registered: a real HCA's pinned pages
  // would still take a peer's writes, our threads would fault on them (seen: a udpong server's progress thread
  // scattering a datagram into a buffer its rsocket table had just freed).
  // Registered again by a fork's child, whose engine starts after whatever the child registered itself.
  if (!g_exit_handler_registered) {
    g_exit_handler_registered = true;
    std::atexit([] {
      std::lock_guard lock(g_engine_mu);
      if (auto e = g_engine.lock()) e->Finish();
    });
  }
  return 0;
}

wire::IpAddress DefaultHostAddress() {
  // The interface of the IPv4 default route with the lowest metric (/proc/net/route is this network namespace's:
  // "Iface Destination Gateway Flags RefCnt Use Metric Mask ...", addresses in hex).
  std::string route_interface;
  if (FILE* f = fopen("/proc/net/route", "re")) {
    char line[256], name[IFNAMSIZ + 1];
    unsigned destination, flags, mask;
    long metric, best = -1;
    while (fgets(line, sizeof line, f) != nullptr) {
      if (sscanf(line, "%16s %x %*x %x %*d %*d %ld %x", name, &destination, &flags, &metric, &mask) == 5 &&
          destination == 0 && mask == 0 && (flags & RTF_UP) != 0 && (best < 0 || metric < best)) {
        best = metric;
        route_interface = name;
      }
    }
    fclose(f);
  }
  std::vector<std::string> ifnames;
  const std::vector<wire::IpAddress> usable = wire::UsableHostAddresses(&ifnames);  // lowest first
  for (size_t i = 0; i < usable.size(); ++i) {
    if (usable[i].is_v4() && ifnames[i] == route_interface) return usable[i];
  }
  for (const wire::IpAddress& a : usable) {
    if (a.is_v4()) return a;
  }
  return usable.empty() ? wire::IpAddress::V4(0x7f000001) : usable.front();
}

std::optional<wire::IpAddress> EngineConfig::HostDeviceAddress() const {
  if (!address_prefix_len) return address ? *address : DefaultHostAddress();
  // The lowest: processes started apart must all come to the same one.
  const Candidates inside = HostAddressesIn(*address, *address_prefix_len);
  if (inside.count == 0) return std::nullopt;
  return inside.at(0);
}

int Engine::StartOnHostDevice(const EngineConfig& config, wire::IpAddress* bound) {
  const std::optional<wire::IpAddress> address = config.HostDeviceAddress();
  if (!address) {
    fprintf(stderr, "uroce: the host device has no address: none of this host's is in %s\n",
            HostAddressesIn(*config.address, *config.address_prefix_len).description.c_str());
    return -EADDRNOTAVAIL;
  }
  *bound = *address;
  auto membership = std::make_unique<HostDeviceMembership>();
  std::string error;
  // Unchosen, the host device is shared only with a service that lasts as long as we do (HostDeviceMembership::Join).
  // Unpinned (no UROCE_ADDR), the device is the host's on all its addresses: a service we start listens on each.
  if (int err = membership->Join(*bound, /*lasting_only=*/!config.device_chosen, /*every_address=*/!config.address,
                                 &error)) {
    fprintf(stderr, "uroce: %s\n", error.c_str());
    return -err;
  }
  // We send from a socket of our own on the device's address (any source port: the service needs only what arrives).
  // A packet of another GID names its source, which the kernel takes over the socket's address (IP_PKTINFO); GID 0's
  // packets carry no control message.
  std::unique_ptr<wire::SocketTransport> sender;
  wire::SocketTransport::Options options;
  options.udp_offloads = !config.one_packet_per_datagram;
  if (int rc = wire::SocketTransport::Create({*bound, 0}, options, &sender); rc < 0) {
    fprintf(stderr, "uroce: cannot open a UDP socket on %s: %s\n", bound->ToString().c_str(), strerror(-rc));
    return rc;
  }
  auto* socket = sender.get();
  udp_counters_ = [socket] { return socket->counters(); };
  auto transport = std::make_unique<wire::HostDeviceTransport>(
      std::move(sender), wire::UdpEndpoint{*bound, wire::kRoceV2UdpPort}, membership->owner(),
      membership->TakeForwardFd(), membership->control_fd(), [this] { OnServiceLost(); }, config.same_host);
  transport->AdoptSteeredSocket(membership->TakeSteeredFd());
  if (membership->every_address()) {
    // The host's GIDs of the other family (IPv6 beside an IPv4 address, or the reverse) leave by a socket of that
    // family on its wildcard, each naming its source; a host without that family has none (EAFNOSUPPORT): no matter.
    std::unique_ptr<wire::SocketTransport> other;
    const wire::IpAddress wildcard = bound->is_v4() ? wire::IpAddress() : wire::IpAddress::V4(0);
    if (wire::SocketTransport::Create({wildcard, 0}, options, &other) == 0)
      transport->SetOtherFamilySender(std::move(other));
  }
  // A process of the host that dies cannot end its rdma_cm connections with us, as its kernel would (DREQ, REJ), nor
  // the messages its XRC target QPs were handing to our SRQs: we end them when its connection hangs up.
  transport->SetPeerGoneHandler([this, address = *bound](uint8_t owner) {
    device_->OnPeerProcessGone(address, owner);
  });
  // A gone process's XRC target QPs we hold run on here (emu::Device::OnPeerProcessGone takes its number over).
  transport->SetOwnerAdopter([joined = membership.get()](uint8_t owner) { return joined->AdoptOwner(owner); });
  if (int rc = transport->Init(); rc < 0) {
    fprintf(stderr, "uroce: cannot take packets from this host's other processes on %s: %s\n",
            wire::HostDevicePeerName(*bound, membership->owner()).c_str(), strerror(-rc));
    return rc;
  }
  // What the service forwards comes through a ring too, when it can map one (else on the datagram socket).
  HostDeviceMembership* joined = membership.get();
  transport->OfferServiceRing(
      [joined](int ring_fd, uint64_t bytes, int doorbell) { return joined->OfferRing(ring_fd, bytes, doorbell); });
  // And what the kernel can steer to our own socket goes there, past the service.
  if (transport->has_steered_socket()) membership->Steer();
  host_transport_ = transport.get();
  transport_ = std::move(transport);
  membership_ = std::move(membership);
  return 0;
}

void Engine::ApplyGids(const wire::SharedGidTable::Entries& entries, bool announce) {
  std::vector<wire::IpAddress> others;
  for (size_t i = 1; i < entries.size(); ++i)
    if (entries[i]) others.push_back(*entries[i]);
  host_transport_->SetOtherHostAddresses(others);
  // The tree is rewritten where the shim made one already: making it takes g_engine_mu (WriteDeviceTree), which Start
  // holds, and which Finish holds while it stops the follower. At Start it is written after (Engine::Acquire).
  if (device_->AssignGids(entries, announce) && announce) RewriteDeviceTree(device_->gids().Populated(), true);
}

void Engine::OnServiceLost() {
  fprintf(stderr, "uroce: the host's device service for %s is gone: uroce0 failed (IBV_EVENT_DEVICE_FATAL)\n",
          address().ToString().c_str());
  device_->Fail();
}

void Engine::PrintStatsOnce() {
  if (!stats_ || !device_ || stats_printed_.exchange(true)) return;
  fputs(CountersText().c_str(), stderr);
}

std::string Engine::CountersText() const {
  std::string text = "uroce: counters of uroce0 at " + device_->config().address.ToString() + " (" +
                     transport_name_ + " transport)\n" +
                     emu::FormatCounters(device_->counters());
  auto faults_line = [](const char* direction, const wire::FaultCounters& c) {
    return std::string(direction) + " seen " + std::to_string(c.seen) + " dropped " + std::to_string(c.dropped) +
           " duplicated " + std::to_string(c.duplicated) + " reordered " + std::to_string(c.reordered) +
           " corrupted " + std::to_string(c.corrupted) + "\n";
  };
  text += "progress_handovers " + std::to_string(handovers_.load()) + "\nprogress_lease_wakeups " +
          std::to_string(lease_wakeups_.load()) + "\napplication_received " +
          std::to_string(app_datagrams_.load()) + "\napplication_think_ns " + std::to_string(poll_pattern_.think_ns()) +
          "\n";
  if (udp_counters_) {
    // What the socket saw: UDP_SEGMENT sends and UDP_GRO receives each carried a run of these datagrams.
    const wire::UdpCounters u = udp_counters_();
    text += "udp_datagrams_sent " + std::to_string(u.packets_sent) + "\nudp_segmented_sends " +
            std::to_string(u.segmented_sends) + "\nudp_datagrams_received " + std::to_string(u.packets_received) +
            "\nudp_coalesced_receives " + std::to_string(u.coalesced_receives) + "\nudp_receive_overflows " +
            std::to_string(u.receive_overflows) + "\n";
  }
  text += "time_scale_percent " + std::to_string(uint64_t(time_scale_ * 100)) + "\n";
  // 1: the clock is read from the CPU's tick counter, the kernel's readings being system calls (wire::TickClock).
  text += "clock_from_tick_counter " + std::to_string(wire::SystemClock::ReadsTickCounter()) + "\n";
  if (host_transport_ != nullptr) {
    text += "host_device_owner " + std::to_string(membership_->owner()) + "\nhost_device_peer_sent " +
            std::to_string(host_transport_->peer_sent()) + "\nhost_device_ring_sent " +
            std::to_string(host_transport_->ring_sent()) + "\nhost_device_peer_drops " +
            std::to_string(host_transport_->peer_drops()) + "\nhost_device_steered_received " +
            std::to_string(host_transport_->steered_received()) + "\nhost_device_direct_bytes " +
            std::to_string(host_transport_->direct_bytes()) + "\nhost_device_shared_writes " +
            std::to_string(host_transport_->shared_writes()) + "\nhost_device_halves_copied " +
            std::to_string(host_transport_->halves_copied()) + "\n";
  }
  if (faults_ != nullptr) {
    text += faults_line("faults_send", faults_->send_counters());
    text += faults_line("faults_receive", faults_->receive_counters());
  }
  return text;
}

void Engine::WriteLiveCounters(uint64_t now_ns) {
  uint64_t due = live_counters_due_ns_.load(std::memory_order_relaxed);
  if (now_ns < due || !live_counters_due_ns_.compare_exchange_strong(due, now_ns + kLiveCountersEveryNs,
                                                                     std::memory_order_relaxed)) {
    return;
  }
  WriteCountersFile(CountersText());
}

void Engine::ProgressLoop() {
  pthread_setname_np(pthread_self(), "uroce-progress");
  emu::Device* dev = device_.get();
  const wire::Clock& clock = wire::SystemClock::Instance();
  bool handed = false;    // the receive side is the applications'
  bool spinning = false;  // receives disarmed: this thread polls the socket without sleeping (kSpinNs)
  uint64_t timers_due = 0;  // while spinning, the device's timers run every kAppTimersEveryNs
  uint64_t now = 0;
  bool now_fresh = false;  // `now` was read at the end of the last turn, after its look: this turn starts with it
  while (!stop_.load(std::memory_order_acquire)) {
    if (!now_fresh) now = clock.NowNs();
    now_fresh = false;
    const uint64_t lease = lease_until_ns_.load(std::memory_order_acquire);
    const bool inside = handed && applications_inside_.load(std::memory_order_acquire) > 0;
    if (lease > now || inside) {
      if (!handed) HandReceiveToApplications(true);
      handed = true;
      spinning = false;  // the receives are re-armed when the lease ends
      // Applications receive and run timers; come back when the lease may have ended, or a while later if it ended
      // with an application thread inside. Every renewal moves the timer back (DriveFromApplication), so while an
      // application keeps polling this thread sleeps through; an early end (EndLease) or a stop makes it expire now.
      const bool for_lease = lease > now;
      ArmLeaseTimer(for_lease ? lease : now + kLeaseNs / 4);
      // An end or a stop between the read above and this arming set the timer before we did: look again.
      if (stop_.load(std::memory_order_acquire) ||
          (for_lease && lease_until_ns_.load(std::memory_order_acquire) == 0))
        continue;
      uint64_t expirations = 0;
      (void)!read(lease_timer_fd_, &expirations, sizeof expirations);  // EINTR: the loop looks again
      lease_wakeups_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (handed) {
      HandReceiveToApplications(false);
      dev->SendHeldAcks();  // held by applications that have stopped polling
    }
    handed = false;
    const uint64_t last_traffic = last_traffic_ns_.load(std::memory_order_relaxed);
    const bool expecting = now < first_packets_until_ns_.load(std::memory_order_relaxed);
    const bool offered = host_transport_ != nullptr && now - host_transport_->last_offer_ns() < kOfferSpinNs;
    const bool spin = (now - last_traffic < spin_ns_ || expecting || offered) &&
                      now - poll_pattern_.last_empty_poll_ns() > app_polling_ns_;
    if (spin != spinning) {
      std::lock_guard lock(receive_mu_);
      transport_->SetReceiveArmed(!spin);  // spinning: straight from the socket, nobody woken per packet
      spinning = spin;
    }
    int64_t timeout = 0;  // spinning: never wait
    if (spin) {
      if (now >= timers_due) {
        timers_due = now + kAppTimersEveryNs;
        dev->RunTimers(timers_due);
      }
    } else {
      const uint64_t returns_by = now - last_traffic < kActiveNs ? now + kTickNs : 0;
      const uint64_t wake_at = wire::EarlierDeadline(dev->RunTimers(returns_by), returns_by);
      timeout = -1;  // idle: block in the kernel until a packet or Wake()
      if (wake_at != 0) {
        now = clock.NowNs();
        timeout = wake_at > now ? static_cast<int64_t>(wake_at - now) : 0;
      }
    }
    int n;
    {
      // A spinning look shares its reading with what it receives; one that may sleep must not (wire::ClockBatch).
      std::optional<wire::ClockBatch> batch;
      if (spin) batch.emplace(now);
      std::lock_guard lock(receive_mu_);
      n = transport_->Poll(handler_, timeout);
    }
    if (n > 0 || !spin) {  // an empty spinning look took no time worth a reading
      now = clock.NowNs();
      now_fresh = true;
    } else if (yield_when_idle_) {
      // Nothing came: give the CPU away before looking again. In a TCG guest on 2 vCPUs with two spinning
      // applications, an application thread queued behind this one waited out a time slice (milliseconds there).
      sched_yield();
    }
    dev->SendHeldAcks(now);
    if (n > 0) last_traffic_ns_.store(now, std::memory_order_relaxed);
    WriteLiveCounters(now);
  }
}

void Engine::QpReadyToReceive(const std::optional<wire::UdpEndpoint>& peer, uint32_t peer_qpn) {
  if (peer && host_transport_ != nullptr) host_transport_->ConnectAhead(*peer, peer_qpn);
  const uint64_t now = wire::SystemClock::Instance().NowNs();
  const uint64_t before = first_packets_until_ns_.exchange(now + kFirstPacketsSpinNs, std::memory_order_relaxed);
  // A progress thread blocked in Poll looks again; one that spins already finds the new time at its next turn.
  if (before <= now && transport_) transport_->Wake();
}

void Engine::HandReceiveToApplications(bool to_applications) {
  std::lock_guard lock(receive_mu_);
  // Re-arming must happen on this thread: io_uring cancels requests whose submitting thread exits.
  transport_->SetReceiveArmed(!to_applications);
  receive_with_applications_ = to_applications;
  if (to_applications) handovers_.fetch_add(1, std::memory_order_relaxed);
}

int Engine::DriveFromApplication() {
  // One reading for the look and everything it receives (wire::ClockBatch), one more if it worked: a spinning
  // application's look is this function, and in a VM without a vDSO clock each reading is a system call.
  const wire::ClockBatch batch;
  const uint64_t now = wire::BatchedClock::Instance().NowNs();
  const bool engaged = poll_pattern_.OnEmptyPoll(now);
  const uint64_t lease = lease_until_ns_.load(std::memory_order_relaxed);
  const uint64_t lease_ns = lease_length_.At(now);
  if (!engaged && (lease <= now || !lease_length_.IsQuiet(lease_ns))) {
    // Applications no longer poll as a receiver would: if they hold the receive side, nobody receives, so it goes
    // back to the progress thread now instead of when the lease runs out. Otherwise packets waited up to kLeaseNs
    // each time a polling thread disengaged: udpong's echo client, which resends after 1 ms without an answer, built
    // up duplicates it then worked through one round trip each, and did not finish in 2 minutes (1 run in 5).
    if (lease > now) EndLease();
    return -1;
  }
  // Disengaged under a quiet lease (LeaseLength: an emulated machine, no packets, every peer direct), a polling thread
  // keeps receiving until the lease runs out, renewing nothing: what waits meanwhile is only ring records for the
  // next poll, which is when a CQ's owner would see them, and a streak that comes back renews it. Ending the lease
  // there cost two wake-ups of the progress thread on busy vCPUs per pause of a polling thread (ib_send_lat in the
  // TCG guest: 13-20 handovers a run).
  if (engaged && lease < now + lease_ns / 2) {
    lease_until_ns_.store(now + lease_ns, std::memory_order_release);
    if (lease <= now) {
      transport_->Wake();  // the progress thread, blocked in Poll, hands the receive side over
      poll_pattern_.OnReceiveSide(false);
      return -1;
    }
    ArmLeaseTimer(now + lease_ns);  // the progress thread sleeps on with the lease
  }
  std::unique_lock lock(receive_mu_, std::try_to_lock);
  const bool held = lock.owns_lock() && receive_with_applications_;
  if (engaged) poll_pattern_.OnReceiveSide(held);  // a disengaged poll samples no think time
  if (!held) return -1;
  applications_inside_.fetch_add(1, std::memory_order_relaxed);
  // ACKs held in an earlier poll that no reply has taken along in their time.
  device_->SendHeldAcks(now);
  const int n = transport_->Poll(handler_, 0);
  bool worked = n > 0;
  if (n > 0) {
    app_datagrams_.fetch_add(uint64_t(n), std::memory_order_relaxed);
    last_traffic_ns_.store(now, std::memory_order_relaxed);
  }
  next_receive_after_send_ns_.store(now + receive_after_send_ns_, std::memory_order_relaxed);  // it just received
  if (now >= app_timers_due_ns_.load(std::memory_order_relaxed)) {
    app_timers_due_ns_.store(now + kAppTimersEveryNs, std::memory_order_relaxed);
    // Until the lease ends, this or the progress thread comes back: timers armed later need no wake-up.
    device_->RunTimers(lease_until_ns_.load(std::memory_order_relaxed));
    WriteLiveCounters(now);
    worked = true;
  }
  // The engine's own work here (processing what arrived, sending what an ACK released) is time inside the library,
  // as a data-path verb's is, not a pause in the application's polling: one drive that sent ib_write_bw's next 64 KiB
  // messages outlasted PollPattern::kStreakGapNs, and its streak of empty polls broke hundreds of times a run.
  if (worked) poll_pattern_.OnTimeInside(wire::ClockBatch::Renew() - now);
  applications_inside_.fetch_sub(1, std::memory_order_relaxed);
  return n > 0 ? n : 0;
}

void Engine::ReceiveAfterSend() {
  if (!receive_with_applications_.load(std::memory_order_relaxed)) return;
  const uint64_t now = wire::BatchedClock::Instance().NowNs();  // the post's reading
  if (now < next_receive_after_send_ns_.load(std::memory_order_relaxed)) return;
  std::unique_lock lock(receive_mu_, std::try_to_lock);
  if (!lock.owns_lock() || !receive_with_applications_.load(std::memory_order_relaxed)) return;
  next_receive_after_send_ns_.store(now + receive_after_send_ns_, std::memory_order_relaxed);
  // A thread that keeps posting -- back inside the library within half a think time (PollPattern::kThinkNs) of
  // leaving it -- keeps the receive side as one that keeps polling does: its CQ need not run empty for it to come
  // back. Under an emulator, posting a 64 KiB WRITE took ~0.5 ms: the lease ran out between the polls that found
  // ib_write_bw's CQ empty, and the progress thread took 88% of the ACKs, woken for each and spinning after it beside
  // the two busy threads on 2 vCPUs (40% of a CPU). Not one that posts and then waits elsewhere (ib_write_lat spins on
  // memory for its peer's WRITE, which nobody would receive for it until the lease ended). An expired or ended lease
  // (EndLease, another thread going to sleep meanwhile) is left to end.
  uint64_t lease = lease_until_ns_.load(std::memory_order_relaxed);
  const uint64_t lease_ns = lease_length_.At(now);
  if (lease > now && lease < now + lease_ns / 2 &&
      now < last_verb_end_ns_.load(std::memory_order_relaxed) + keeps_posting_ns_ &&
      lease_until_ns_.compare_exchange_strong(lease, now + lease_ns, std::memory_order_acq_rel)) {
    ArmLeaseTimer(now + lease_ns);
  }
  const int n = transport_->Poll(handler_, 0);
  if (n > 0) {
    app_datagrams_.fetch_add(uint64_t(n), std::memory_order_relaxed);
    last_traffic_ns_.store(now, std::memory_order_relaxed);
  }
}

void Engine::ApplicationSleeps() {
  poll_pattern_.OnSleep(wire::SystemClock::Instance().NowNs());
  device_->SendHeldAcks();  // nobody replies while it sleeps
  EndLease();
}

void Engine::EndLease() {
  if (lease_until_ns_.exchange(0, std::memory_order_acq_rel) == 0) return;
  ArmLeaseTimer(0);
}

void Engine::ArmLeaseTimer(uint64_t at_ns) {
  if (lease_timer_fd_ < 0) return;
  // An absolute time on CLOCK_MONOTONIC, wire::SystemClock's; 0 would disarm, so "now" is 1 ns, long past.
  const uint64_t at = at_ns == 0 ? 1 : at_ns;
  itimerspec when{};
  when.it_value.tv_sec = static_cast<time_t>(at / 1'000'000'000);
  when.it_value.tv_nsec = static_cast<long>(at % 1'000'000'000);
  timerfd_settime(lease_timer_fd_, TFD_TIMER_ABSTIME, &when, nullptr);
}

int Engine::JoinMulticast(const wire::IpAddress& group) {
  std::lock_guard lock(multicast_mu_);
  if (!multicast_) {
    emu::Device* device = device_.get();
    multicast_ = std::make_unique<wire::MulticastReceiver>(
        address(), wire::kRoceV2UdpPort,
        [device](const wire::InDatagram& d) { device->OnDatagram(d); });
  }
  return multicast_->Join(group);
}

void Engine::LeaveMulticast(const wire::IpAddress& group) {
  std::lock_guard lock(multicast_mu_);
  if (multicast_) multicast_->Leave(group);
}

void Engine::Finish() {
  gid_follower_.Stop();
  if (device_) device_->SendHeldAcks();
  PrintStatsOnce();
  {
    std::lock_guard lock(multicast_mu_);
    multicast_.reset();  // its thread delivers into the device
  }
  stop_.store(true, std::memory_order_release);
  // A Start that failed part-way leaves no thread and possibly no transport.
  if (transport_) transport_->Wake();
  ArmLeaseTimer(0);
  if (progress_.joinable()) progress_.join();
}

Engine::~Engine() {
  Finish();
  if (lease_timer_fd_ >= 0) close(lease_timer_fd_);
  device_.reset();
  transport_.reset();
  if (pcap_) pcap_->Close();
}

}  // namespace uroce::verbs
