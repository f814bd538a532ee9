// The per-process engine behind the device "uroce0": configuration, the io_uring UDP transport bound to this
// process's address, the emulated HCA, and the progress thread that feeds it packets and timers — so delivery never
// waits for the application to call a verb (ib_write_bw's server sits in a blocking TCP read while the client writes
// into its memory).
//
// Who receives (docs/ARCHITECTURE.md, "Progress"): by default the progress thread, blocked in the kernel between
// packets. But a thread that keeps polling an empty CQ is a CPU already spent waiting, and waking a sleeping thread
// costs ~30 us on these machines: once an application polls empty CQs the way PollPattern recognises, the
// progress thread disarms the transport's receives and steps aside for a lease that every empty poll renews; the
// polling thread then receives, processes and sends itself (DriveFromApplication), and nobody is woken per packet.
// The lease ends when polling stops (kLeaseNs) or at once when the application arms a CQ to sleep
// (ibv_req_notify_cq); the progress thread then takes the receive side back.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "emu/device.h"
#include "verbs_api/gid_table_follower.h"
#include "verbs_api/host_device.h"
#include "verbs_api/lease_length.h"
#include "verbs_api/poll_pattern.h"
#include "wire/address.h"
#include "wire/clock.h"
#include "wire/fault_transport.h"
#include "wire/host_device_transport.h"
#include "wire/multicast_receiver.h"
#include "wire/pcap.h"
#include "wire/transport.h"
#include "wire/udp_socket.h"

namespace uroce::verbs {

// Which Transport carries the device's packets (UROCE_TRANSPORT).
enum class TransportChoice {
  kAuto,    // io_uring where the kernel allows it, else plain sockets (said once on stderr)
  kUring,   // io_uring or fail
  kSocket,  // recvmmsg/sendmmsg + poll, without trying io_uring
};

struct EngineConfig {
  std::optional<wire::IpAddress> address;  // pinned address; default: first free of 127.0.0.1 ... 127.0.255.254
  // With address_prefix_len (UROCE_ADDR=A/N): not one address but the first of this host's addresses inside A/N
  // whose port is free, so that every process of a job finds one of its own on a real interface.
  std::optional<int> address_prefix_len;
  uint16_t port = wire::kRoceV2UdpPort;
  emu::Mtu mtu = emu::Mtu::k4096;
  bool mtu_set = false;  // UROCE_MTU given; otherwise the address's interface decides (at most 4096)
  std::string pcap_path;  // capture every packet sent and received (UROCE_PCAP)
  std::string faults;     // fault-injection spec (UROCE_FAULTS), see wire/fault_model.h
  bool stats = false;     // print the device's counters to stderr when the engine ends (UROCE_STATS=1)
  bool retry_forever = false;  // retry_cnt 7 retries forever, as kernel rxe does (UROCE_RETRY_FOREVER=1)
  bool trace = false;          // print the protocol's decision trace on stderr (UROCE_TRACE=1)
  TransportChoice transport = TransportChoice::kAuto;  // UROCE_TRANSPORT=uring|socket
  // UROCE_ONE_PACKET_PER_DATAGRAM=1: no UDP_SEGMENT runs, so that a capture of the interface (tcpdump -i lo, where
  // loopback never splits a run) shows each RoCE packet as a datagram of its own, its ICRC for the IP ID 0 it has.
  bool one_packet_per_datagram = false;
  // The host device (the default, or UROCE_DEVICE=host): this process shares the host device of HostDeviceAddress()
  // with every process of the network namespace that does the same, through the host's device service
  // (docs/ARCHITECTURE.md, "The host device"), as every process of a host shares its HCA. UROCE_DEVICE=process: the
  // device owns an address of its own (`address`, or the first free loopback address).
  bool host_device = true;
  // UROCE_DEVICE was given. Without it, a process that cannot share the host device (no service binary, 255 processes
  // on it, a service in a PID namespace that may end before us) falls back to a device of its own, saying why once;
  // with UROCE_DEVICE=host it fails instead.
  bool device_chosen = false;
  // The address a host device takes, its GID index 0: `address`; with address_prefix_len (UROCE_ADDR=A/N) the lowest
  // of this host's addresses inside A/N, which every process of the host finds alike, or nullopt when the host has
  // none there; with neither, DefaultHostAddress().
  std::optional<wire::IpAddress> HostDeviceAddress() const;
  // UROCE_SAME_HOST=shm|unix|udp: on the host device, how packets between two processes of the host travel
  // (wire/host_device_transport.h): shared-memory rings (default), the peers' UNIX connections, or real UDP through
  // the service, so that tcpdump sees them.
  wire::SameHostPath same_host = wire::SameHostPath::kSharedMemory;
  // UROCE_DIRECT=0: on the host device, RDMA WRITE and READ between two of its processes go as packets too. By
  // default (with the shared-memory path, no capture and no fault injection) the initiator carries them out in the
  // target's memory (wire/direct_access.h).
  bool direct = true;
};

// Reads UROCE_ADDR, UROCE_PORT, UROCE_MTU, UROCE_PCAP, UROCE_FAULTS, UROCE_STATS, UROCE_RETRY_FOREVER,
// UROCE_TRANSPORT, UROCE_ONE_PACKET_PER_DATAGRAM, UROCE_DEVICE, UROCE_SAME_HOST, UROCE_DIRECT, and the config file
// named by UROCE_CONFIG (default /etc/uroce.conf, if present): "key = value" lines with the same keys in lower case without
// the prefix (address, port, mtu, ...); the environment wins.
// Returns 0, or an errno with *error set to a message naming the variable or file line at fault: EINVAL for a bad
// value or line, the open error (ENOENT, EACCES) for an unreadable UROCE_CONFIG.
int LoadEngineConfig(EngineConfig* config, std::string* error);

// The address the host device takes when nothing names one: the host's address, as a RoCE NIC's GID 0 is its
// interface's. The first IPv4 address of the interface of the IPv4 default route; else the lowest IPv4 address of
// an interface that is up (carrier or not), not a loopback one and not link-local (169.254.0.0/16); else the lowest
// such IPv6 address (not fe80::/10); else 127.0.0.1. Every process of a network namespace comes to the same one.
wire::IpAddress DefaultHostAddress();

// Node GUID of this host's uroce0 (stable for a host, never 0; the device exists before its address is bound).
uint64_t NodeGuid();

class Engine {
 public:
  // The process's engine, created on first use; nullptr with errno set, after one line on stderr saying why, when
  // it cannot start (bad configuration, no free address, UROCE_TRANSPORT=uring where io_uring is refused).
  static std::shared_ptr<Engine> Acquire();
  // The process's engine if one runs, without starting one.
  static std::shared_ptr<Engine> Running();

  ~Engine();
  emu::Device& device() { return *device_; }
  // Prints the counters (once) if UROCE_STATS asked for them: at the end of the engine or of the process.
  void PrintStatsOnce();
  // The counters as UROCE_STATS prints them: "uroce: counters of uroce0 at ADDRESS (...)", then "name value" lines.
  std::string CountersText() const;
  // While the engine runs (and has work), its counters are written every kLiveCountersEveryNs into the file `counters`
  // of the discovery shim's folder for this process, where `uroce stats` reads them (verbs_api/device_tree.h).
  static constexpr uint64_t kLiveCountersEveryNs = 500'000'000;
  const wire::IpAddress& address() const { return device_->config().address; }
  // The network side of ibv_attach_mcast(3): receive the datagrams of IPv4 group `group` (counted; the first join
  // starts the multicast receiver's thread). 0, or EINVAL (IPv6 group) / the errno of its socket.
  int JoinMulticast(const wire::IpAddress& group);
  void LeaveMulticast(const wire::IpAddress& group);
  // Our share of the host device (the default), or nullptr; its transport, or nullptr.
  HostDeviceMembership* membership() { return membership_.get(); }
  wire::HostDeviceTransport* host_transport() { return host_transport_; }
  // What this process imported from the host's other processes (ibv_import_pd(3) / ibv_import_mr(3) of handles
  // that came with another process's cmd_fd): one PD of ours stands for each of theirs, and each of their regions
  // is registered here once, however many handles are on it.
  struct Imports {
    std::mutex mu;
    std::map<std::pair<uint8_t, uint32_t>, std::pair<emu::ProtectionDomain*, int>> pds;  // (owner, handle) -> ours
    std::map<uint32_t, int> regions;  // lkey -> handles
  };
  Imports& imports() { return imports_; }
  // "io_uring", "socket" or "host device": the transport this engine runs on.
  const char* transport_name() const { return transport_name_; }

  // Called by an application thread that found a CQ empty: when applications hold the receive side, receives what
  // is queued, processes it (completions, replies) and runs due timers. Returns the number of datagrams processed,
  // or -1 when this thread did not receive (the progress thread still does, or another application thread is).
  // Never blocks.
  int DriveFromApplication();
  // An application thread is about to sleep on a completion event (ibv_req_notify_cq): the receive side goes back to
  // the progress thread now instead of at the end of the lease.
  void ApplicationSleeps();
  // After ibv_post_send: while applications hold the receive side, a thread that keeps sending without finding its
  // CQ empty (UC and UD sends complete at once) would receive nothing until the lease ends, not even a receiver's
  // CNP asking it to pause (emu::DeviceCore::kCnpPauseNs). So a send also receives what is queued, at most every
  // kReceiveAfterSendNs. Never blocks.
  void ReceiveAfterSend();
  static constexpr uint64_t kReceiveAfterSendNs = 20'000;
  // A QP entered RTR (ibv_modify_qp): it can receive, and its peer's first packets usually follow soon. The progress
  // thread spins for kFirstPacketsSpinNs, as it does for kSpinNs after a datagram (unless an application polls), so
  // that they find it running on a CPU of its own. Asleep, it would be placed where the first packet wakes it: the
  // sender's kernel wakes it onto the sender's CPU when the other one is busy for a moment (the scheduler's
  // wake-affine choice). On 2 cores the responder's progress thread then shared a CPU with the requester's
  // application thread for ~4 ms until the load balancer moved it; the requester heard no ACK while it ran, went back
  // early and cut its window each time. ib_write_bw 64 KiB, perftest's 5,000 messages: early retransmissions in 5 of
  // 10 runs (up to 9) without the spin, in 0 of 10 with it (and in 0 of 8 with a spin of 5 ms).
  // `peer` (the QP's destination, when it has one: RC, UC, XRC) is also where its packets will go: on the host
  // device, the connection to a peer of the host is made now, not with the first packet (HostDeviceTransport::
  // ConnectAhead).
  void QpReadyToReceive(const std::optional<wire::UdpEndpoint>& peer = std::nullopt, uint32_t peer_qpn = 0);
  static constexpr uint64_t kFirstPacketsSpinNs = 20'000'000;
  // How many times the receive side went from the progress thread to applications (printed as progress_handovers).
  uint64_t handovers() const { return handovers_.load(std::memory_order_relaxed); }
  // How many times the progress thread woke while applications held the receive side (progress_lease_wakeups).
  uint64_t lease_wakeups() const { return lease_wakeups_.load(std::memory_order_relaxed); }
  // A poll returned completions: the start of the application's think time (PollPattern).
  void NoteCompletion() { poll_pattern_.OnCompletion(wire::BatchedClock::Instance().NowNs()); }
  // Times one data-path verb (ibv_post_send, ibv_post_recv, ...): PollPattern leaves it out of think times. While
  // it runs, an application thread is inside the library and the lease does not end (`keeps_lease`; not for the
  // CPU a disengaged poller gives away, which is no work of the library's). `lengthy` false: a verb that cannot
  // take long (one receive posted) is not timed: its ~0.1 us is nothing beside PollPattern's thresholds, and its
  // two clock readings and four atomics were on a ping-pong's critical path. A send is always timed: it includes the
  // send system call (~3.5 us on loopback), which as think time made ib_send_lat's server disengage.
  class VerbTimer {
   public:
    explicit VerbTimer(Engine& engine, bool keeps_lease = true, bool lengthy = true)
        : engine_(engine),
          start_ns_(lengthy ? wire::BatchedClock::Instance().NowNs() : 0),
          keeps_lease_(keeps_lease && lengthy) {
      if (keeps_lease_) engine_.applications_inside_.fetch_add(1, std::memory_order_relaxed);
    }
    ~VerbTimer() {
      if (start_ns_ != 0) {
        const uint64_t end = wire::ClockBatch::Renew();
        engine_.poll_pattern_.OnTimeInside(end - start_ns_);
        engine_.last_verb_end_ns_.store(end, std::memory_order_relaxed);
      }
      if (keeps_lease_) engine_.applications_inside_.fetch_sub(1, std::memory_order_relaxed);
    }
    VerbTimer(const VerbTimer&) = delete;
    VerbTimer& operator=(const VerbTimer&) = delete;

   private:
    Engine& engine_;
    const uint64_t start_ns_;
    const bool keeps_lease_;
  };

 private:
  Engine() = default;
  int Start(const EngineConfig& config);
  void ProgressLoop();
  // Applications give the receive side back to the progress thread now rather than at the end of the lease.
  void EndLease();
  // Sets lease_timer_fd_ to expire at `at_ns` (wire::SystemClock's time), or at once for 0.
  void ArmLeaseTimer(uint64_t at_ns);
  // The progress thread's side of the lease: hands the receive side to applications or takes it back.
  void HandReceiveToApplications(bool to_applications);
  // Writes the counters file when kLiveCountersEveryNs have passed since the last write (one thread writes).
  void WriteLiveCounters(uint64_t now_ns);
  // The engine's end, and the process's exit if it comes first: the held ACKs leave, the counters are printed
  // (UROCE_STATS), and the multicast receiver's thread and the progress thread, which deliver into the device, stop.
  // Application threads may still drive the device. Safe to call again.
  void Finish();

  // How long one empty poll keeps the receive side: also how long packets may wait when a polling thread stops
  // without arming a CQ. The progress thread sleeps until the lease ends, and each renewal moves that wake-up back
  // (lease_timer_fd_). Each wake-up of it preempts a polling thread on a 2-core machine: waking twice per lease to
  // look, an ib_send_lat pair switched context ~19,000 times a second at 200 us and ~4,000 at 1 ms (average 8.7 ->
  // 6.9 us, 99th percentile 28 -> 21 us); sleeping through, the client's progress thread woke ~16 times a second
  // instead of ~1,000 (99th percentile 17.3 -> 11.3 us). Longer on an emulated machine whose peers are all direct
  // (LeaseLength).
  static constexpr uint64_t kLeaseNs = LeaseLength::kLeaseNs;
  static constexpr uint64_t kAppTimersEveryNs = 250'000;  // how often polling applications run the device's timers
  // While packets flowed in the last kActiveNs the progress thread comes back every kTickNs even with no timer due,
  // so arming a (longer) retransmit timer per message never needs to wake it (Device::RunTimers).
  static constexpr uint64_t kTickNs = 10'000'000;
  static constexpr uint64_t kActiveNs = 1'000'000'000;
  // After a datagram the progress thread keeps receiving without sleeping for kSpinNs (receives disarmed, reading
  // with MSG_DONTWAIT): a stream's next packet then finds it awake, and the sender's kernel wakes nobody per packet
  // (ib_write_bw 64 KiB: 0.7 -> 1.5 GB/s here). Not while an application thread of this process polled a CQ in the
  // last kAppPollingNs: such a thread spins already and either receives itself or, like ib_write_lat, waits on memory
  // -- a spinning progress thread beside it crowded a 2-core machine (ib_write_lat 40 -> 130 us).
  static constexpr uint64_t kSpinNs = 50'000;
  // After another process's offer of a WRITE's half (wire::HostDeviceTransport::CopyWrite) the progress thread spins
  // this long: the next comes microseconds later unless the initiator lost its CPU, and the one that lost it to us
  // (woken by its notice onto its CPU, the other idle) got it back only when we slept: 50 us of spin, then a sleep,
  // a doorbell and a wake-up onto that CPU again, one offer per 0.1 ms for 10 ms before the load balancer moved us
  // (`perf sched timehist`, ib_write_bw 64 KiB). Spinning on, we stay runnable there and are moved within a tick.
  static constexpr uint64_t kOfferSpinNs = 2'000'000;
  // How long a start on a configured address (UROCE_ADDR) waits for it to be free (Start).
  static constexpr uint64_t kBindRetryNs = 1'000'000'000;
  static constexpr uint64_t kAppPollingNs = 1'000'000;

  int StartOnHostDevice(const EngineConfig& config, wire::IpAddress* bound);
  // On a host device that listens on every address: GID entries 1.. become those of the host's table (the service's,
  // wire::SharedGidTable), whose addresses the transport's same-host path reaches too; `announce`:
  // IBV_EVENT_GID_CHANGE when that changed anything (not for the table the device starts with).
  void ApplyGids(const wire::SharedGidTable::Entries& entries, bool announce);
  GidTableFollower gid_follower_;  // calls ApplyGids; stopped before device_ goes
  // The host device's service died (from the thread that polls the transport): the device fails (emu::Device::Fail).
  void OnServiceLost();
  // Our membership in the host device; outlives transport_, which watches its control socket.
  std::unique_ptr<HostDeviceMembership> membership_;
  Imports imports_;
  std::unique_ptr<wire::PcapWriter> pcap_;  // outlives transport_, which writes to it
  std::unique_ptr<wire::Transport> transport_;
  std::unique_ptr<emu::Device> device_;
  std::mutex multicast_mu_;
  std::unique_ptr<wire::MulticastReceiver> multicast_;  // delivers into device_; stopped before it
  std::thread progress_;
  const char* transport_name_ = "";
  bool stats_ = false;
  std::atomic<bool> stats_printed_{false};
  std::atomic<uint64_t> live_counters_due_ns_{0};
  std::function<wire::UdpCounters()> udp_counters_;  // the UDP socket transport's, for UROCE_STATS
  wire::FaultInjectingTransport* faults_ = nullptr;  // the fault decorator inside transport_ (UROCE_FAULTS)
  wire::HostDeviceTransport* host_transport_ = nullptr;  // inside transport_ on the host device
  std::atomic<bool> stop_{false};

  wire::DatagramHandler handler_;  // into device_
  std::mutex receive_mu_;          // held by whichever thread calls transport_->Poll
  // Receives disarmed, applications poll. Written under receive_mu_; read without it by ReceiveAfterSend's first look.
  std::atomic<bool> receive_with_applications_{false};
  std::atomic<uint64_t> next_receive_after_send_ns_{0};
  std::atomic<uint64_t> lease_until_ns_{0};        // applications hold the receive side until then
  // Application threads inside the library's data path now (VerbTimer, DriveFromApplication's work): while one is,
  // the progress thread does not take the receive side back, even after the lease. A drive that sends what a batch
  // of ACKs released, or one preempted for a time slice (4 ms seen on 2 cores), outlasted the lease, and each
  // take-back was followed by a handover back (ib_write_bw 64 KiB: 150-210 a run in its slow runs).
  std::atomic<int> applications_inside_{0};
  PollPattern poll_pattern_;                       // whether a polling application should receive
  // How many times slower than an ordinary machine this one runs (MeasureTimeScale, at Start), and the thresholds
  // above stretched by it: a budget of work, not of nanoseconds.
  double time_scale_ = 1;
  uint64_t spin_ns_ = kSpinNs, app_polling_ns_ = kAppPollingNs, receive_after_send_ns_ = kReceiveAfterSendNs;
  uint64_t keeps_posting_ns_ = PollPattern::kThinkNs / 2;  // ReceiveAfterSend, scaled
  // A spinning progress thread that found nothing yields its CPU before looking again: only on a machine that runs
  // PollPattern::kEmulatedScale times slower than an ordinary one or more (an emulator, where a lost time slice is
  // milliseconds). Not elsewhere: there it gained nothing measurable, and with it perftest's UC ib_send_bw under a
  // flood on 2 cores (which waits for every message, so one lost hangs it) hung in one rehearsal of the suite: a
  // receiving progress thread that gives its CPU away may let its socket overflow.
  bool yield_when_idle_ = false;
  uint64_t Scaled(uint64_t ns) const { return uint64_t(double(ns) * time_scale_); }
  // How long a renewal lasts: kLeaseNs, stretched on an emulated machine while no packet comes (the handler reports
  // packets).
  LeaseLength lease_length_;
  std::atomic<uint64_t> app_timers_due_ns_{0};
  std::atomic<uint64_t> last_traffic_ns_{0};       // when a Poll last delivered something (kActiveNs)
  std::atomic<uint64_t> last_verb_end_ns_{0};      // when a timed data-path verb last returned (VerbTimer)
  std::atomic<uint64_t> first_packets_until_ns_{0};  // the progress thread spins until then (QpReadyToReceive)
  // The progress thread sleeps on this timer (CLOCK_MONOTONIC, absolute) during a lease, armed for the lease's end
  // and moved back by each renewal (kLeaseNs), so a thread that keeps polling is not preempted by its wake-ups.
  int lease_timer_fd_ = -1;
  std::atomic<uint64_t> handovers_{0}, app_datagrams_{0};  // printed with the counters
  // The progress thread's wake-ups while applications held the receive side (printed as progress_lease_wakeups):
  // each is a thread made runnable beside them, which on a machine with no idle CPU takes one from a polling thread.
  std::atomic<uint64_t> lease_wakeups_{0};
};

}  // namespace uroce::verbs
