#include "wire/unix_socket.h"

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace uroce::wire {

socklen_t AbstractUnixAddress(std::string_view name, sockaddr_un* sun) {
  *sun = {};
  sun->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(sun->sun_path) - 1);
  std::memcpy(sun->sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

bool PeerIsUsOrRoot(int fd, pid_t* pid) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  if (pid != nullptr) *pid = cred.pid;
  return cred.uid == geteuid() || cred.uid == 0;
}

}  // namespace uroce::wire
