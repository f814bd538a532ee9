// HostDeviceTransport: the Transport of one process's share of the host device (docs/ARCHITECTURE.md, "The host
// device"). The host's device service holds UDP 4791 of the device's address and forwards each arriving packet to the
// process that owns its destination, on a datagram socket the process handed it (wire/service_protocol.h: a
// ForwardHeader, then the RoCEv2 packet). Sending needs no one: a RoCEv2 receiver looks only at the destination port,
// so the process sends from a UDP socket of its own on the same address and an ephemeral source port (the flow
// entropy a RoCE source port carries anyway).
//
//  - Send / OutgoingFlow: the `sender` transport's (a SocketTransport bound to address:0).
//  - Poll: recvmmsg(MSG_DONTWAIT) on the forward socket, ppoll on it and a wake-up eventfd when nothing is queued.
//    The control socket to the service is watched in the same ppoll: its hang-up (the service died) is reported once
//    through `on_service_lost`, from the polling thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "wire/address.h"
#include "wire/transport.h"

namespace uroce::wire {

class HostDeviceTransport final : public Transport {
 public:
  // `forward_fd`: our end of the datagram socket the service forwards on (taken over: closed by the destructor).
  // `control_fd`: the connection to the service, only watched (not closed). `local`: address:4791 of the device.
  HostDeviceTransport(std::unique_ptr<Transport> sender, const UdpEndpoint& local, int forward_fd, int control_fd,
                      std::function<void()> on_service_lost);
  ~HostDeviceTransport() override;
  HostDeviceTransport(const HostDeviceTransport&) = delete;
  HostDeviceTransport& operator=(const HostDeviceTransport&) = delete;

  // 0, or -errno of eventfd(2).
  int Init();

  UdpEndpoint local() const override { return local_; }
  Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t src_port) const override {
    return sender_->OutgoingFlow(dst, src_port);
  }
  int Send(std::span<const OutDatagram> batch) override { return sender_->Send(batch); }
  int Poll(const DatagramHandler& handler, int64_t timeout_ns) override;
  void Wake() override;

  Transport& sender() { return *sender_; }
  uint64_t malformed() const { return malformed_.load(std::memory_order_relaxed); }

  static constexpr unsigned kBatch = 64;
  static constexpr size_t kMaxForwarded = 9216 + 64;

 private:
  int ReceiveQueued(const DatagramHandler& handler);

  std::unique_ptr<Transport> sender_;
  UdpEndpoint local_;
  int forward_fd_;
  int control_fd_;
  int wake_fd_ = -1;
  std::function<void()> on_service_lost_;
  bool service_lost_ = false;
  std::vector<uint8_t> buffers_;
  std::atomic<uint64_t> malformed_{0};
};

}  // namespace uroce::wire
