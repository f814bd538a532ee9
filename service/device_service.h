// The host's device service (docs/ARCHITECTURE.md, "The host device"): one per address and network namespace, started
// on demand by the first process that opens the host device there, gone when the last has gone. It owns what must be
// unique on the host for that address: UDP 4791, the owner numbers that make the processes' QPNs, XRC SRQ numbers
// and CM comm IDs distinct (wire/service_protocol.h), and the routes of CM service IDs to listening processes; and it
// forwards each arriving packet to the process that owns its destination.
//
// Its control plane is Boost.Asio on one thread (readiness only: Boost 1.74 has no SOCK_SEQPACKET protocol, so the
// socket calls are ours): a SOCK_SEQPACKET abstract UNIX socket (wire::DeviceServiceName)
// that processes connect to, and the UDP socket's readiness. A process is admitted only if the kernel says it runs as
// our user or root (SO_PEERCRED): abstract names carry no permissions (unix(7)). A process's connection is its
// lifetime: when it closes (the process exited or died), its owner number and routes are released; numbers are
// handed out cyclically, so a dead process's number is not reused at once and its peers' late packets meet "no
// route" (dropped, counted) rather than a newcomer's QPs.
#pragma once

#include <sys/types.h>

#include <array>
#include <utility>  // before Boost.Asio 1.74, whose awaitable.hpp uses std::exchange without it under C++20

#include <boost/asio.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "emu/gid_table.h"
#include "wire/address.h"
#include "wire/packet_ring.h"
#include "wire/service_protocol.h"
#include "wire/shared_gid_table.h"
#include "wire/udp_socket.h"

namespace uroce::service {

struct ServiceCounters {
  uint64_t received = 0;         // datagrams taken from UDP 4791
  uint64_t forwarded = 0;        // handed to a process
  uint64_t no_route = 0;         // nobody owns the destination (a dead process's QPN, no listener): dropped
  uint64_t process_full = 0;     // its ring or forward socket was full: dropped, as a full receive queue drops
  uint64_t rings = 0;            // processes that had us forward into a ring of theirs (kRingOffer)
  uint64_t bad_control = 0;      // control messages refused
  uint64_t processes_joined = 0;
  uint64_t steered = 0;  // processes given a UDP socket of their own, to which the kernel steers their packets
  uint64_t refused = 0;  // REQs and SIDR_REQs for a service ID nobody listens on, answered as the kernel's CM does
  uint64_t adopted = 0;  // owner numbers of gone processes taken over by a process holding their XRC target QPs
};

class DeviceService {
 public:
  // `linger`: how long the service stays with no process before it leaves (absorbs programs that open and close
  // devices in bursts, as libfabric's fi_getinfo does). `max_processes` (1..wire::kMaxOwners): how many processes
  // may share the device at once; the next gets EUSERS, as when the owner numbers run out.
  // `every_address`: UDP `udp_port` of the host's other addresses of the address's family too (wire::OtherGids,
  // followed as they come and go), so that the device receives at each (its GID table lists them); else of the
  // address alone.
  DeviceService(boost::asio::io_context& io, const wire::IpAddress& address, uint16_t udp_port,
                std::chrono::milliseconds linger, unsigned max_processes = wire::kMaxOwners,
                bool every_address = false);
  ~DeviceService();

  // Takes the service's name and then UDP `udp_port` of the address. 0; -EADDRINUSE when another service has the
  // name (the caller leaves: that one serves); for the UDP port, the errno is kept and told to every process that
  // joins (kWelcome status), so that each can say why it cannot open the device.
  int Start();
  // Runs until no process has been connected for `linger` (after at least one has come, or from the start).
  void Run();

  std::string CountersText() const;

 private:
  struct Process {
    boost::asio::posix::stream_descriptor control;  // SOCK_SEQPACKET; Asio only waits, the calls are ours
    int forward_fd = -1;  // the datagram socket the process handed us
    std::unique_ptr<wire::PacketRing> ring;  // once it offered one: where its packets go instead
    int doorbell = -1;                       // its eventfd, rung when it sleeps
    bool unpublished = false;                // records written into its ring since the last Publish
    uint8_t owner = 0;
    pid_t pid = 0;                  // as it said in its hello
    std::vector<uint8_t> adopted;  // numbers of gone processes it took over (kAdoptOwner), released with its own
    explicit Process(boost::asio::io_context& io) : control(io) {}
    ~Process();
  };

  void AcceptNext();
  void Admit(std::shared_ptr<Process> p);
  void ReadControl(std::shared_ptr<Process> p);
  // `fds`: the descriptors that came with `m`; it keeps what it needs and closes the rest.
  void HandleControl(Process& p, const wire::ControlMessage& m, std::vector<int>& fds);
  void Reply(Process& p, wire::ControlType type, int32_t status, uint64_t value);
  void Leave(Process& p);
  // Waits for datagrams on `socket`, bound to `local` (the address's socket or another address's), and forwards them.
  // The wait holds the descriptor: a wait already completed still runs after the socket was closed and let go
  // (FollowOtherAddresses), and then finds it closed.
  void WaitUdp(std::shared_ptr<boost::asio::posix::stream_descriptor> socket, const wire::UdpEndpoint& local);
  // One receive's worth from the UDP socket `fd` bound to `local` (UDP_GRO runs split into their datagrams), each
  // forwarded; then the rings written are published. How many datagrams it took, or -errno (-EAGAIN: none queued).
  int DrainUdp(int fd, const wire::UdpEndpoint& local);
  // `d`, received on socket `fd` bound to `bound`, to the process it is for (or answered, AnswerUnheardRequest).
  void Forward(const wire::InDatagram& d, int fd, const wire::IpAddress& bound);
  // A REQ or SIDR_REQ for a service ID none of our processes listens on gets the kernel CM's answer at once
  // (wire::NoListenerAnswer: REJ "invalid service ID", SIDR_REP "unsupported"), so that rdma_connect fails with
  // ECONNREFUSED rather than after its REQ's retries. Sent to the requester's device (its address, our UDP port):
  // from our own host that is our own socket's group again, and the answer comes back here to be routed by its comm
  // ID like any other. Sent on the socket it came in by (its address's, of its family). Nothing for other packets.
  void AnswerUnheardRequest(const wire::InDatagram& d, int fd, const wire::IpAddress& bound);
  Process* RouteTo(std::span<const uint8_t> packet);
  // The kernel's steering (wire::AttachOwnerSteering): whether it is on, set up at Start; the UDP socket of owner
  // number `owner` (made at its first join, drained of a former holder's packets at a later one) for the process
  // that now has it, or -errno; and the program for the owners that have a process now.
  int SteeredSocket(uint8_t owner);
  void Steer();
  uint8_t NextOwner();
  void ArmLingerIfIdle();

  boost::asio::io_context& io_;
  wire::IpAddress address_;
  uint16_t udp_port_;
  // every_address: a UDP socket on each of the host's other addresses, received and forwarded as the address's own
  // (there the kernel steers nothing: everything goes through us), and the netlink socket that says when they change.
  // Not the address's own socket with the wildcard's reach: that would hold UDP 4791 of every loopback address too,
  // where processes with devices of their own bind (UROCE_DEVICE=process).
  bool every_address_;
  // Each other address's socket (owned by its descriptor, which a wait in progress keeps alive: WaitUdp).
  std::map<wire::IpAddress, std::shared_ptr<boost::asio::posix::stream_descriptor>> others_;
  boost::asio::posix::stream_descriptor address_changes_;
  void FollowOtherAddresses();  // opens and closes sockets to match wire::OtherGids, and publishes the table
  void WaitAddressChanges();
  // The host device's GID table (every_address): address_ at entry 0, each other address we receive on after it by
  // emu::GidTable's rule, published in shared memory every process maps (wire::SharedGidTable, handed out with
  // kWelcome), so that an index names one address in all of them.
  emu::GidTable gids_;
  std::unique_ptr<wire::SharedGidTable> shared_gids_;
  std::chrono::milliseconds linger_;
  boost::asio::posix::stream_descriptor acceptor_;  // the listening SOCK_SEQPACKET socket
  std::shared_ptr<boost::asio::posix::stream_descriptor> udp_;
  int udp_fd_ = -1;
  int udp_error_ = 0;  // why UDP could not be bound (told to every process)
  boost::asio::steady_timer linger_timer_;
  std::array<Process*, 256> by_owner_{};
  std::map<uint64_t, uint8_t> listeners_;  // CM service ID -> owner
  uint8_t last_owner_ = 0;
  size_t processes_ = 0;   // connected
  unsigned max_processes_;
  unsigned members_ = 0;   // connected and given an owner number (at most max_processes_)
  ServiceCounters counters_;
  wire::DatagramReceiver receiver_;
  wire::UdpCounterSet udp_counters_;
  uint32_t gsi_psn_ = 0;  // the PSN of the next MAD we send (AnswerUnheardRequest)
  std::vector<Process*> unpublished_;  // processes whose rings have records not yet published (DrainUdp)
  // Steering. The group's sockets are never closed before the service leaves: a socket leaves an SO_REUSEPORT group
  // when its last descriptor closes, and the kernel then moves the group's last socket into its place, which the
  // service could not follow (the process holds a descriptor too); so each index stays what it was bound as.
  bool steering_ = false;
  std::array<int, 256> owner_socket_;        // by owner number: its socket's descriptor, -1 before its first join
  std::array<uint16_t, 256> socket_index_{};  // by owner number: that socket's index in the group (0: none yet)
  std::array<uint16_t, 256> steer_to_{};      // by owner number: where packets go now (0: the service's socket)
  uint16_t group_size_ = 1;                   // the service's own socket is index 0
};

}  // namespace uroce::service
