// The per-process engine behind the device "uroce0": configuration, the io_uring UDP transport bound to this
// process's address, the emulated HCA, and the progress thread that feeds it packets and timers — so delivery never
// waits for the application to call a verb (ib_write_bw's server sits in a blocking TCP read while the client writes
// into its memory).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "emu/device.h"
#include "wire/address.h"
#include "wire/fault_transport.h"
#include "wire/multicast_receiver.h"
#include "wire/pcap.h"
#include "wire/transport.h"

namespace uroce::verbs {

// Which Transport carries the device's packets (UROCE_TRANSPORT).
enum class TransportChoice {
  kAuto,    // io_uring where the kernel allows it, else plain sockets (said once on stderr)
  kUring,   // io_uring or fail
  kSocket,  // recvmmsg/sendmmsg + poll, without trying io_uring
};

struct EngineConfig {
  std::optional<wire::IpAddress> address;  // pinned address; default: first free of 127.0.0.1 ... 127.0.255.254
  uint16_t port = wire::kRoceV2UdpPort;
  emu::Mtu mtu = emu::Mtu::k4096;
  std::string pcap_path;  // capture every packet sent and received (UROCE_PCAP)
  std::string faults;     // fault-injection spec (UROCE_FAULTS), see wire/fault_model.h
  bool stats = false;     // print the device's counters to stderr when the engine ends (UROCE_STATS=1)
  bool retry_forever = false;  // retry_cnt 7 retries forever, as kernel rxe does (UROCE_RETRY_FOREVER=1)
  TransportChoice transport = TransportChoice::kAuto;  // UROCE_TRANSPORT=uring|socket
};

// Reads UROCE_ADDR, UROCE_PORT, UROCE_MTU, UROCE_PCAP, UROCE_FAULTS, UROCE_STATS, UROCE_RETRY_FOREVER,
// UROCE_TRANSPORT, and the config file named by UROCE_CONFIG (default /etc/uroce.conf, if present): "key = value"
// lines with the same keys in lower case without the prefix (address, port, mtu, ...); the environment wins.
// Returns 0, or an errno with *error set to a message naming the variable or file line at fault: EINVAL for a bad
// value or line, the open error (ENOENT, EACCES) for an unreadable UROCE_CONFIG.
int LoadEngineConfig(EngineConfig* config, std::string* error);

// Node GUID of this host's uroce0 (stable for a host, never 0; the device exists before its address is bound).
uint64_t NodeGuid();

class Engine {
 public:
  // The process's engine, created on first use; nullptr with errno set, after one line on stderr saying why, when
  // it cannot start (bad configuration, no free address, UROCE_TRANSPORT=uring where io_uring is refused).
  static std::shared_ptr<Engine> Acquire();

  ~Engine();
  emu::Device& device() { return *device_; }
  // Prints the counters (once) if UROCE_STATS asked for them: at the end of the engine or of the process.
  void PrintStatsOnce();
  const wire::IpAddress& address() const { return device_->config().address; }
  // The network side of ibv_attach_mcast(3): receive the datagrams of IPv4 group `group` (counted; the first join
  // starts the multicast receiver's thread). 0, or EINVAL (IPv6 group) / the errno of its socket.
  int JoinMulticast(const wire::IpAddress& group);
  void LeaveMulticast(const wire::IpAddress& group);
  // "io_uring" or "socket": the transport this engine runs on.
  const char* transport_name() const { return transport_name_; }

 private:
  Engine() = default;
  int Start(const EngineConfig& config);
  void ProgressLoop();

  std::unique_ptr<wire::PcapWriter> pcap_;  // outlives transport_, which writes to it
  std::unique_ptr<wire::Transport> transport_;
  std::unique_ptr<emu::Device> device_;
  std::mutex multicast_mu_;
  std::unique_ptr<wire::MulticastReceiver> multicast_;  // delivers into device_; stopped before it
  std::thread progress_;
  const char* transport_name_ = "";
  bool stats_ = false;
  std::atomic<bool> stats_printed_{false};
  wire::FaultInjectingTransport* faults_ = nullptr;  // the fault decorator inside transport_ (UROCE_FAULTS)
  std::atomic<bool> stop_{false};
};

}  // namespace uroce::verbs
