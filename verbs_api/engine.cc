#include "verbs_api/engine.h"

#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "wire/clock.h"
#include "wire/capture_transport.h"
#include "wire/fault_model.h"
#include "wire/fault_transport.h"
#include "wire/pcap.h"
#include "wire/uring_transport.h"

namespace uroce::verbs {
namespace {

std::mutex g_engine_mu;
std::weak_ptr<Engine> g_engine;

std::string Trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  const auto e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

int ApplySetting(EngineConfig* c, const std::string& key, const std::string& value, std::string* error) {
  if (key == "address") {
    auto a = wire::IpAddress::Parse(value);
    if (!a) return *error = "bad address '" + value + "'", EINVAL;
    c->address = *a;
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
  } else if (key == "pcap") {
    c->pcap_path = value;
  } else if (key == "faults") {
    c->faults = value;
  } else if (key == "stats") {
    c->stats = value == "1" || value == "yes" || value == "true";
  } else if (key == "retry_forever") {
    c->retry_forever = value == "1" || value == "yes" || value == "true";
  } else {
    return *error = "unknown setting '" + key + "'", EINVAL;
  }
  return 0;
}

// The child of a fork() has no progress thread: the parent's engine must not be used (or destroyed) there. A new
// ibv_open_device in the child starts a fresh engine on a new address.
void ForgetEngineInChild() {
  // Keep the inherited engine alive forever: its destructor would join a thread that does not exist here.
  if (auto inherited = g_engine.lock()) new std::shared_ptr<Engine>(std::move(inherited));
  g_engine.reset();
}

}  // namespace

int LoadEngineConfig(EngineConfig* config, std::string* error) {
  const char* file = std::getenv("UROCE_CONFIG");
  std::ifstream in(file ? file : "/etc/uroce.conf");
  if (file && !in) return *error = std::string("cannot read UROCE_CONFIG=") + file, EINVAL;
  std::string line;
  while (std::getline(in, line)) {
    line = Trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos) return *error = "config line without '=': " + line, EINVAL;
    if (int err = ApplySetting(config, Trim(line.substr(0, eq)), Trim(line.substr(eq + 1)), error)) return err;
  }
  static const char* kKeys[] = {"address", "port", "mtu", "pcap", "faults", "stats", "retry_forever"};
  for (const char* key : kKeys) {
    std::string env = "UROCE_";
    for (const char* k = key; *k; ++k) env += static_cast<char>(*k - 'a' + 'A');
    if (const char* v = std::getenv(env == "UROCE_ADDRESS" ? "UROCE_ADDR" : env.c_str())) {
      if (int err = ApplySetting(config, key, v, error)) return err;
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
  std::lock_guard lock(g_engine_mu);
  if (auto e = g_engine.lock()) return e;
  EngineConfig config;
  std::string error;
  if (int err = LoadEngineConfig(&config, &error)) {
    fprintf(stderr, "uroce: %s\n", error.c_str());
    errno = err;
    return nullptr;
  }
  std::shared_ptr<Engine> e(new Engine());
  if (int err = e->Start(config)) {
    errno = err;
    return nullptr;
  }
  g_engine = e;
  return e;
}

int Engine::Start(const EngineConfig& config) {
  std::unique_ptr<wire::UringTransport> uring;
  wire::IpAddress bound;
  if (config.address) {
    int rc = wire::UringTransport::Create({*config.address, config.port}, &uring);
    if (rc < 0) {
      fprintf(stderr, "uroce: cannot bind %s: %s\n", wire::UdpEndpoint{*config.address, config.port}.ToString().c_str(),
              strerror(-rc));
      return -rc;
    }
    bound = *config.address;
  } else {
    // Embedded default: the first free loopback address, so processes on one machine reach each other unconfigured.
    int rc = -EADDRINUSE;
    for (uint32_t n = 1; n < 255 && rc == -EADDRINUSE; ++n) {
      bound = wire::IpAddress::V4(0x7f000000u + n);
      rc = wire::UringTransport::Create({bound, config.port}, &uring);
    }
    if (rc < 0) {
      fprintf(stderr, "uroce: no free address 127.0.0.1-254 on UDP port %u: %s\n", config.port, strerror(-rc));
      return -rc;
    }
  }
  transport_ = std::move(uring);
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
  dc.active_mtu = config.mtu;
  dc.node_guid = NodeGuid();
  dc.retry_cnt_7_infinite = config.retry_forever;
  device_ = std::make_unique<emu::Device>(dc, *transport_, wire::SystemClock::Instance());
  progress_ = std::thread([this] { ProgressLoop(); });
  stats_ = config.stats;
  if (stats_) {
    // A program may exit without closing the device: print then too.
    static std::once_flag once;
    std::call_once(once, [] {
      std::atexit([] {
        std::lock_guard lock(g_engine_mu);
        if (auto e = g_engine.lock()) e->PrintStatsOnce();
      });
    });
  }
  return 0;
}

void Engine::PrintStatsOnce() {
  if (!stats_ || stats_printed_.exchange(true)) return;
  std::string text = "uroce: counters of uroce0 at " + device_->config().address.ToString() + "\n" +
                     emu::FormatCounters(device_->counters());
  auto faults_line = [](const char* direction, const wire::FaultCounters& c) {
    return std::string(direction) + " seen " + std::to_string(c.seen) + " dropped " + std::to_string(c.dropped) +
           " duplicated " + std::to_string(c.duplicated) + " reordered " + std::to_string(c.reordered) +
           " corrupted " + std::to_string(c.corrupted) + "\n";
  };
  if (faults_ != nullptr) {
    text += faults_line("faults_send", faults_->send_counters());
    text += faults_line("faults_receive", faults_->receive_counters());
  }
  fputs(text.c_str(), stderr);
}

void Engine::ProgressLoop() {
  pthread_setname_np(pthread_self(), "uroce-progress");
  emu::Device* dev = device_.get();
  const wire::DatagramHandler handler = [dev](const wire::InDatagram& d) { dev->OnDatagram(d); };
  while (!stop_.load(std::memory_order_acquire)) {
    const uint64_t deadline = dev->RunTimers();
    int64_t timeout = -1;  // idle: block in the kernel until a packet or Wake()
    if (deadline != 0) {
      const uint64_t now = wire::SystemClock::Instance().NowNs();
      timeout = deadline > now ? static_cast<int64_t>(deadline - now) : 0;
    }
    transport_->Poll(handler, timeout);
  }
}

Engine::~Engine() {
  PrintStatsOnce();
  stop_.store(true, std::memory_order_release);
  transport_->Wake();
  if (progress_.joinable()) progress_.join();
  device_.reset();
  transport_.reset();
  if (pcap_) pcap_->Close();
}

}  // namespace uroce::verbs
