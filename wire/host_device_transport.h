// HostDeviceTransport: the Transport of one process's share of the host device (docs/ARCHITECTURE.md, "The host
// device"). The host's device service holds UDP 4791 of the device's address and forwards each packet arriving there
// to the process that owns its destination, on a datagram socket the process handed it (wire/service_protocol.h: a
// ForwardHeader, then the RoCEv2 packet). Sending needs no one: a RoCEv2 receiver looks only at the destination port,
// so the process sends from a UDP socket of its own on the same address and an ephemeral source port (the flow
// entropy a RoCE source port carries anyway).
//
// Packets between two processes of the host device never pass the service: each process listens on an abstract
// SOCK_SEQPACKET name of its own (HostDevicePeerName: address and owner number), and a sender whose packet is for its
// own address and names an owner (a data packet's DestQP; CM MADs still go by UDP, the service routes them) connects
// to the owner's name once and sends the packet there, with the same ForwardHeader, as a whole RoCEv2 packet. A full
// connection drops the packet (counted), as a full UDP receive buffer would: blocking could deadlock two processes
// sending to each other, and RC retransmits. Both ends of a peer connection must run as our user or root
// (SO_PEERCRED), as the service admits only those: another user's process holding a name gets nothing.
//
//  - Send / OutgoingFlow: the `sender` transport's (a SocketTransport bound to address:0), or the peer connection.
//  - Poll: epoll over the service's forward socket, the peer listener and the accepted peer connections, a wake-up
//    eventfd and the control socket to the service, whose hang-up (the service died) is reported once through
//    `on_service_lost`, from the polling thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "wire/address.h"
#include "wire/transport.h"

namespace uroce::wire {

class HostDeviceTransport final : public Transport {
 public:
  // `forward_fd`: our end of the datagram socket the service forwards on (taken over: closed by the destructor).
  // `control_fd`: the connection to the service, only watched (not closed). `local`: address:4791 of the device.
  // `owner`: our owner number (the name we listen on for the host's other processes).
  HostDeviceTransport(std::unique_ptr<Transport> sender, const UdpEndpoint& local, uint8_t owner, int forward_fd,
                      int control_fd, std::function<void()> on_service_lost);
  ~HostDeviceTransport() override;
  HostDeviceTransport(const HostDeviceTransport&) = delete;
  HostDeviceTransport& operator=(const HostDeviceTransport&) = delete;

  // 0, or -errno: of eventfd(2), epoll_create1(2), or of binding our peer name (-EADDRINUSE: someone holds it).
  int Init();

  UdpEndpoint local() const override { return local_; }
  Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t src_port) const override {
    return sender_->OutgoingFlow(dst, src_port);
  }
  int Send(std::span<const OutDatagram> batch) override;
  int Poll(const DatagramHandler& handler, int64_t timeout_ns) override;
  void Wake() override;

  uint64_t malformed() const { return malformed_.load(std::memory_order_relaxed); }
  // Packets for a process of this host that could not be handed over (no such process, its connection full).
  uint64_t peer_drops() const { return peer_drops_.load(std::memory_order_relaxed); }
  uint64_t peer_sent() const { return peer_sent_.load(std::memory_order_relaxed); }

  static constexpr unsigned kBatch = 64;
  static constexpr size_t kMaxForwarded = 9216 + 64;

 private:
  int ReceiveQueued(int fd, const DatagramHandler& handler, bool* closed);
  int ReceiveReady(const DatagramHandler& handler, int timeout_ms);
  // The owner a datagram goes to directly, or 0 (to the network, the service included).
  uint8_t PeerOwner(const OutDatagram& dg) const;
  // Hands the first datagrams of `run` (all for process `owner`; at most kBatch) to it in one sendmmsg, or drops
  // them (counted: no such process, its connection full). Returns how many it took.
  size_t SendToPeer(uint8_t owner, std::span<const OutDatagram> run);
  int PeerConnection(uint8_t owner, bool reconnect);

  std::unique_ptr<Transport> sender_;
  UdpEndpoint local_;
  uint8_t owner_;
  int forward_fd_;
  int control_fd_;
  int wake_fd_ = -1;
  int epoll_fd_ = -1;
  int listen_fd_ = -1;
  std::function<void()> on_service_lost_;
  bool service_lost_ = false;
  std::vector<uint8_t> buffers_;
  std::vector<int> accepted_;  // peer connections to us (polling thread only)
  std::mutex peers_mu_;        // our connections to the other processes
  std::map<uint8_t, int> peers_;
  std::vector<int> retired_;  // replaced connections, closed at the end (another thread may still send on them)
  std::atomic<uint64_t> malformed_{0}, peer_drops_{0}, peer_sent_{0};
};

}  // namespace uroce::wire
