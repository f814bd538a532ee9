// Notices when a uroce device on this host disappears (its process died), so that its connections end as they do
// with the kernel's rdma_cm: there, a process that dies has its ids destroyed by the kernel, which sends DREQs (or
// REJs) on its behalf. A uroce process killed with SIGKILL sends nothing, so each library announces its device with
// an abstract SOCK_SEQPACKET listener (`uroce/cm/v1/device/<address>/<random>`, never accepted) and watches the
// devices it talks to by connecting to theirs: when a process dies the kernel closes its listener and every watcher
// sees POLLHUP at once (unix(7)). Devices elsewhere (a kernel peer, another host) have no announcement and are not
// watched: their own kernel speaks for them.
//
// Abstract names are first come, first served: the random part keeps another process from taking a device's name
// before it starts, and a watcher believes an announcement only from a trusted user (abstract_names.h), checked
// again on the connected socket (SO_PEERCRED), so a stranger's socket that closes cannot end our connections. A
// peer on this host that sent us a request and has no announcement left that answers, and whose RoCE port nobody
// holds any more, died before we looked: it is gone at once, as its kernel would have said with a REJ. One with no
// announcement whose port is still held may have died a moment ago: a killed process's io_uring releases the sockets
// its requests hold only when the kernel's deferred ring teardown has run (io_uring_setup(2)), which under load takes
// a while. Such a peer is looked at again every kUnsureLookNs for kUnsureForNs: its port freed, it is gone; an
// announcement found, it is watched; neither, it is taken for what it is, a device with a kernel of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "wire/address.h"

namespace uroce::rdmacm {

class PeerWatch {
 public:
  // Starts the watching thread and announces `self`; `on_gone` runs on that thread (no lock of ours held).
  // 0, or the errno of what failed: the thread's eventfd (nothing is watched), or the announcement's socket, bind or
  // listen (peers are watched, but this process's exit is seen by nobody).
  int Start(const wire::IpAddress& self, std::function<void(const wire::IpAddress&)> on_gone);
  // Watches `peer` if it is an announced device of this host and not watched yet; reports it gone if it is a device
  // of this host that has died.
  void Watch(const wire::IpAddress& peer);

  static constexpr uint64_t kUnsureLookNs = 50'000'000;
  static constexpr uint64_t kUnsureForNs = 10'000'000'000;  // well inside a REP's retries (about 16 s here)

 private:
  // What a look at a peer found (LookLocked).
  enum class Seen { kAnnounced, kGone, kHeld, kForeign };
  // Connects to the peer's announcement (watched_) or judges it by its RoCE port; mu_ held.
  Seen LookLocked(const wire::IpAddress& peer);
  // Looks again at every unsure peer: moves it to watched_ or found_dead_, or gives up on it when its time is over.
  void LookAtUnsure();
  void Run();
  std::function<void(const wire::IpAddress&)> on_gone_;
  wire::IpAddress self_;
  int announce_fd_ = -1;
  int wake_fd_ = -1;
  std::mutex mu_;
  std::map<wire::IpAddress, int> watched_;  // peer -> connected socket
  std::vector<wire::IpAddress> found_dead_;  // for the thread to report
  std::map<wire::IpAddress, uint64_t> unsure_;  // unannounced peers whose port is held -> when to give up
  std::thread thread_;
};

}  // namespace uroce::rdmacm
