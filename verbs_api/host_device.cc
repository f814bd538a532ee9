#include "verbs_api/host_device.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "wire/unix_socket.h"

extern char** environ;

namespace uroce::verbs {

namespace {

// How long a join waits for a service to answer, one it started itself included.
constexpr auto kJoinTimeout = std::chrono::seconds(10);
// What the service may queue towards us before it drops (a full receive queue): asked for on its end of the pair;
// the kernel caps it at net.core.wmem_max unless we may force it.
constexpr int kForwardBufferBytes = 16 << 20;

bool Executable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

// The service binary: UROCE_DEVICE_SERVICE; else beside this library (an install's lib/uroce/), else in the service
// folder next to the library's (a Bazel output tree or runfiles: verbs_api/ and service/).
std::string ServiceBinary() {
  if (const char* env = std::getenv("UROCE_DEVICE_SERVICE"); env != nullptr && *env != '\0') return env;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ServiceBinary), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string dir = info.dli_fname;
  const size_t slash = dir.rfind('/');
  dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  for (const std::string& candidate : {dir + "/uroce-deviced", dir + "/../service/uroce-deviced"}) {
    if (Executable(candidate)) return candidate;
  }
  return "";
}

// Starts the service for `address` in a session of its own (it forks away and we reap the intermediate process),
// with no descriptor of ours but /dev/null on 0-2 (a pipe of our caller's held open by it would keep that caller
// waiting for EOF). `every_address`: it receives on every address of the host (--every-address). 0 or an errno.
int SpawnService(const std::string& binary, const wire::IpAddress& address, bool every_address) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // UROCE_SERVICE_LOG=FILE: the service writes its counters there when it leaves.
  const char* log = std::getenv("UROCE_SERVICE_LOG");
  const bool logging = log != nullptr && *log != '\0';
  for (int fd = 0; fd <= 2; ++fd) {
    if (fd == 2 && logging) {
      posix_spawn_file_actions_addopen(&actions, fd, log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    } else {
      posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", O_RDWR, 0);
    }
  }
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const std::string address_text = address.ToString();
  std::vector<const char*> argv = {binary.c_str(), "--address", address_text.c_str(), "--daemonize"};
  if (every_address) argv.push_back("--every-address");
  if (logging) argv.push_back("--stats");
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, binary.c_str(), &actions, &attr, const_cast<char**>(argv.data()), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return rc;
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return 0;
}

int ConnectService(const wire::IpAddress& address) {
  sockaddr_un sun;
  const socklen_t len = wire::AbstractUnixAddress(wire::DeviceServiceName(address), &sun);
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sun), len) < 0) {
    const int err = errno;
    close(fd);
    return -err;
  }
  return fd;
}

// The service at the other end of `fd` runs in our PID namespace: its PID is visible to us (SO_PEERCRED gives 0 for
// one that is not) and /proc names the same namespace for it as for us.
bool InOurPidNamespace(int fd) {
  ucred peer{};
  socklen_t len = sizeof peer;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) < 0 || peer.pid <= 0) return false;
  struct stat ours, theirs;
  const std::string path = "/proc/" + std::to_string(peer.pid) + "/ns/pid";
  if (stat("/proc/self/ns/pid", &ours) < 0 || stat(path.c_str(), &theirs) < 0) return true;  // no /proc: PID seen
  return ours.st_ino == theirs.st_ino && ours.st_dev == theirs.st_dev;
}

}  // namespace

HostDeviceMembership::~HostDeviceMembership() {
  if (control_fd_ >= 0) close(control_fd_);
  if (forward_fd_ >= 0) close(forward_fd_);
  if (steered_fd_ >= 0) close(steered_fd_);
  if (gid_table_fd_ >= 0) close(gid_table_fd_);
}

int HostDeviceMembership::TryJoin(const wire::IpAddress& address, bool lasting_only, std::string* error) {
  const int fd = ConnectService(address);
  if (fd < 0) return fd == -ENOENT ? -ECONNREFUSED : fd;  // a name nobody holds: ECONNREFUSED
  if (lasting_only && !InOurPidNamespace(fd)) {
    close(fd);
    *error = "the host device of " + address.ToString() +
             " is served from another PID namespace (a sandbox's?), which may end before this process";
    return EXDEV;
  }
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, pair) < 0) {
    const int err = errno;
    close(fd);
    return *error = std::string("socketpair: ") + strerror(err), err;
  }
  // The service writes into pair[1]: in-flight datagrams count against the sender's buffer (unix(7)).
  if (setsockopt(pair[1], SOL_SOCKET, SO_SNDBUFFORCE, &kForwardBufferBytes, sizeof kForwardBufferBytes) < 0) {
    setsockopt(pair[1], SOL_SOCKET, SO_SNDBUF, &kForwardBufferBytes, sizeof kForwardBufferBytes);
  }
  const int sent = wire::SendControl(fd, {wire::ControlType::kHello, 0, uint64_t(getpid())}, pair[1]);
  close(pair[1]);
  wire::ControlMessage welcome;
  std::vector<int> passed;  // with the welcome: the host's GID table and our own UDP socket, as the value says
  // The service closed (it was leaving) is -EAGAIN: try again.
  int rc = sent < 0 ? -EAGAIN : wire::ReceiveControl(fd, 5000, &welcome, &passed);
  const wire::UntakenDescriptors close_untaken(passed);
  if (rc == 0 && welcome.type != wire::ControlType::kWelcome) rc = -EPROTO;
  if (rc == 0 && welcome.status != 0) {
    const int err = welcome.status;
    *error = "the device service of " + address.ToString() + " refused us: " + strerror(err) +
             (err == EADDRINUSE ? " (UDP 4791 of the address is another program's, such as kernel rxe)" : "");
    rc = err;
  } else if (rc == -ETIMEDOUT || rc == -EPROTO) {
    *error = "the device service of " + address.ToString() + " did not answer";
    rc = -rc;
  }
  if (rc != 0) {
    close(fd);
    close(pair[0]);
    return rc;
  }
  control_fd_ = fd;
  forward_fd_ = pair[0];
  owner_ = static_cast<uint8_t>(welcome.value);
  every_address_ = (welcome.value & wire::kWelcomeEveryAddress) != 0;
  size_t next = 0;
  if ((welcome.value & wire::kWelcomeGidTable) != 0 && next < passed.size()) {
    gid_table_fd_ = passed[next];
    passed[next++] = -1;
  }
  if (next < passed.size()) {
    steered_fd_ = passed[next];
    passed[next] = -1;
  }
  return 0;
}

int HostDeviceMembership::Join(const wire::IpAddress& address, bool lasting_only, bool every_address,
                               std::string* error) {
  const auto give_up = std::chrono::steady_clock::now() + kJoinTimeout;
  std::optional<std::chrono::steady_clock::time_point> last_spawn;
  for (int attempt = 0;; ++attempt) {
    const int rc = TryJoin(address, lasting_only, error);
    if (rc >= 0) return rc;
    const auto now = std::chrono::steady_clock::now();
    if (now > give_up) {
      *error = "no device service for " + address.ToString() + " answered within " +
               std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kJoinTimeout).count()) + " s";
      return ETIMEDOUT;
    }
    if (rc == -ECONNREFUSED && (!last_spawn || now - *last_spawn > std::chrono::seconds(1))) {
      // Nobody serves the address: start a service. Several processes may do so at once; the first to take the
      // name serves, the others leave at once (service/main.cc).
      const std::string binary = ServiceBinary();
      if (binary.empty()) {
        *error = "cannot start the host's device service: no uroce-deviced beside the library (UROCE_DEVICE_SERVICE "
                 "names it)";
        return ENOENT;
      }
      if (int err = SpawnService(binary, address, every_address)) {
        *error = "cannot start " + binary + ": " + strerror(err);
        return err;
      }
      last_spawn = now;
    } else if (rc != -ECONNREFUSED && rc != -EAGAIN) {
      *error = std::string("cannot reach the host's device service: ") + strerror(-rc);
      return -rc;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(attempt < 20 ? 1 : 10));
  }
}

int HostDeviceMembership::Request(wire::ControlType type, uint64_t value, std::span<const int> passed_fds) {
  std::lock_guard lock(request_mu_);
  if (control_fd_ < 0) return EPIPE;
  if (int rc = wire::SendControl(control_fd_, {type, 0, value}, passed_fds); rc < 0) return -rc;
  wire::ControlMessage reply;
  const int rc = wire::ReceiveControl(control_fd_, 5000, &reply);
  if (rc != 0) return rc == -EAGAIN ? EPIPE : -rc;
  if (reply.type != wire::ControlType::kReply) return EPROTO;
  return reply.status;
}

int HostDeviceMembership::AdoptOwner(uint8_t owner) {
  // We may see the process gone (its pidfd) before the service sees its connection close.
  for (int tries = 0; tries < 500; ++tries) {
    if (const int err = Request(wire::ControlType::kAdoptOwner, owner); err != EAGAIN) return err;
    usleep(2000);
  }
  return EAGAIN;
}

int HostDeviceMembership::Listen(uint64_t service_id) { return Request(wire::ControlType::kListen, service_id); }
int HostDeviceMembership::Unlisten(uint64_t service_id) { return Request(wire::ControlType::kUnlisten, service_id); }
int HostDeviceMembership::OfferRing(int ring_fd, uint64_t ring_bytes, int doorbell) {
  const int fds[2] = {ring_fd, doorbell};
  return Request(wire::ControlType::kRingOffer, ring_bytes, fds);
}

}  // namespace uroce::verbs
