// The base of every per-QP transport object (RC requester, completer and responder; UC; UD): the QP it works for and
// the device core it shares with the others (device_core.h). Not copyable: a QP's objects live and die with it.
#pragma once

namespace uroce::emu {

class DeviceCore;
class QueuePair;

class TransportObject {
 public:
  TransportObject(const TransportObject&) = delete;
  TransportObject& operator=(const TransportObject&) = delete;

 protected:
  TransportObject(DeviceCore& core, QueuePair& qp) : core_(core), qp_(qp) {}
  ~TransportObject() = default;

  DeviceCore& core_;
  QueuePair& qp_;
};

}  // namespace uroce::emu
