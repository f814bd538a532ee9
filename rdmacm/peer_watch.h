// Notices when a uroce device on this host disappears (its process died), so that its connections end as they do
// with the kernel's rdma_cm: there, a process that dies has its ids destroyed by the kernel, which sends DREQs (or
// REJs) on its behalf. A uroce process killed with SIGKILL sends nothing, so each library announces its device with
// an abstract SOCK_SEQPACKET listener (`uroce/cm/v1/device/<address>`, never accepted) and watches the devices it
// talks to by connecting to theirs: when a process dies the kernel closes its listener and every watcher sees
// POLLHUP at once (unix(7)). Devices elsewhere (a kernel peer, another host) have no announcement and are not
// watched: their own kernel speaks for them.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "wire/address.h"

namespace uroce::rdmacm {

class PeerWatch {
 public:
  // Announces `self` and starts the watching thread; `on_gone` runs on that thread (no lock of ours held).
  // 0 or errno (the announcement's socket/bind/listen, or the thread).
  int Start(const wire::IpAddress& self, std::function<void(const wire::IpAddress&)> on_gone);
  // Watches `peer` if it is an announced device of this host and not watched yet.
  void Watch(const wire::IpAddress& peer);

 private:
  void Run();
  std::function<void(const wire::IpAddress&)> on_gone_;
  wire::IpAddress self_;
  int announce_fd_ = -1;
  int wake_fd_ = -1;
  std::mutex mu_;
  std::map<wire::IpAddress, int> watched_;  // peer -> connected socket
  std::thread thread_;
};

}  // namespace uroce::rdmacm
