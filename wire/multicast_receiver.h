// Receives the RoCEv2 datagrams of IP multicast groups (UD multicast, IBTA 10.5 over RoCEv2 = IP multicast to UDP
// 4791). A device's own UDP socket is bound to its unicast address and never sees them, so each joined group gets a
// socket of its own, bound to group:port with SO_REUSEADDR (every process of the host that joined receives a copy)
// and a membership on the interface of the device's address; one thread reads them all and hands each datagram to
// the callback, as a Transport's Poll would.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "wire/address.h"
#include "wire/transport.h"

namespace uroce::wire {

class MulticastReceiver {
 public:
  // `local`: the device's address (its interface receives the group); `deliver` runs on the receiver's thread.
  MulticastReceiver(IpAddress local, uint16_t port, std::function<void(const InDatagram&)> deliver);
  ~MulticastReceiver();
  MulticastReceiver(const MulticastReceiver&) = delete;
  MulticastReceiver& operator=(const MulticastReceiver&) = delete;

  // Joins IPv4 group `group` (counted: Leave as often as Join). 0, EINVAL for an IPv6 group (not supported), or the
  // errno of socket/setsockopt/bind.
  int Join(const IpAddress& group);
  void Leave(const IpAddress& group);

 private:
  struct Group {
    int fd = -1;
    int joins = 0;
  };
  void Run();

  const IpAddress local_;
  const uint16_t port_;
  std::function<void(const InDatagram&)> deliver_;
  std::mutex mu_;
  std::map<IpAddress, Group> groups_;
  int wake_fd_ = -1;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace uroce::wire
