// A process's membership in the host device (docs/ARCHITECTURE.md, "The host device"; the default): the
// connection to the host's device service for an address, started on demand (no command to run first, no root).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "wire/address.h"
#include "wire/service_protocol.h"

namespace uroce::verbs {

class HostDeviceMembership {
 public:
  HostDeviceMembership() = default;
  ~HostDeviceMembership();
  HostDeviceMembership(const HostDeviceMembership&) = delete;
  HostDeviceMembership& operator=(const HostDeviceMembership&) = delete;

  // Connects to the service of `address` in this network namespace, starting it when nobody serves the address (the
  // binary: UROCE_DEVICE_SERVICE, else uroce-deviced beside this library or in ../service/ of its folder), and joins:
  // hands it the datagram socket it forwards our packets on and gets our owner number. 0, or an errno with *error
  // saying why: what the service could not do (EADDRINUSE: UDP 4791 of the address is another program's; EUSERS: 255
  // processes share it already; EACCES: it runs as another user), ENOENT (no service binary), ETIMEDOUT.
  // `lasting_only`: join only a service of our own PID namespace, else EXDEV. One started in another (a sibling
  // sandbox's, such as another Bazel test's) ends with that namespace, taking the device from under us; one in a
  // parent namespace cannot be told from it (its PID is 0 to us, SO_PEERCRED). `every_address`: a service we start
  // receives on every address of the host (the one we join tells whether it does: every_address()).
  int Join(const wire::IpAddress& address, bool lasting_only, bool every_address, std::string* error);

  // Asks the service to route new connections for a CM service ID to us / to stop. 0 or an errno (EADDRINUSE:
  // another process listens; EPIPE: the service is gone).
  int Listen(uint64_t service_id);
  int Unlisten(uint64_t service_id);
  // Asks the service to forward our packets into the PacketRing of memfd `ring_fd` (`ring_bytes` of data) from now
  // on, ringing `doorbell` (an eventfd) when we sleep, instead of on the datagram socket. 0 or an errno (EINVAL: the
  // service could not map it; EPIPE: the service is gone).
  int OfferRing(int ring_fd, uint64_t ring_bytes, int doorbell);
  // Asks the service to have the kernel steer our packets from other hosts to the UDP socket the welcome brought
  // (TakeSteeredFd), which the transport now receives on. 0 or an errno (EINVAL: none was given; EPIPE).
  int Steer() { return Request(wire::ControlType::kSteer, 0); }
  // Asks the service to route what is for owner number `owner`, whose process is gone, to us (wire::ControlType::
  // kAdoptOwner), waiting up to a second for the service to see that process leave. 0 or an errno (EALREADY: another
  // process took it; EAGAIN: its process is still there; EPIPE).
  int AdoptOwner(uint8_t owner);

  int control_fd() const { return control_fd_; }
  // Ours to hand to the transport, which then owns it.
  int TakeForwardFd() {
    const int fd = forward_fd_;
    forward_fd_ = -1;
    return fd;
  }
  // The UDP socket the service handed us with the welcome, where the kernel steers our packets from other hosts
  // (wire::AttachOwnerSteering), or -1 when it does not steer. Ours to hand to the transport, which then owns it.
  int TakeSteeredFd() {
    const int fd = steered_fd_;
    steered_fd_ = -1;
    return fd;
  }
  uint8_t owner() const { return owner_; }
  // The service receives on UDP 4791 of every address of the host (it was started unpinned), so the device's GID
  // table lists them all; else on the device's address alone.
  bool every_address() const { return every_address_; }
  // The host's GID table the service shares (wire::SharedGidTable's memfd; every_address only), the caller's to
  // close; -1 when the service gave none.
  int TakeGidTableFd() {
    const int fd = gid_table_fd_;
    gid_table_fd_ = -1;
    return fd;
  }

 private:
  int TryJoin(const wire::IpAddress& address, bool lasting_only, std::string* error);
  int Request(wire::ControlType type, uint64_t value, std::span<const int> passed_fds = {});

  int control_fd_ = -1;
  int forward_fd_ = -1;
  int steered_fd_ = -1;
  int gid_table_fd_ = -1;
  uint8_t owner_ = 0;
  bool every_address_ = false;
  std::mutex request_mu_;  // one control request at a time
};

}  // namespace uroce::verbs
