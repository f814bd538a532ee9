// UNIX sockets in the abstract namespace (unix(7)), through which uroce's processes and the host's device service
// find each other without files: the address of a name, and who holds the other end of a connection.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <string_view>

namespace uroce::wire {

// Fills *sun with the abstract address of `name` (sun_path[0] == 0, then the name without a terminator, cut at
// sun_path's size) and returns its length for bind(2) / connect(2).
socklen_t AbstractUnixAddress(std::string_view name, sockaddr_un* sun);

// Whether the process at the other end of the connected UNIX socket `fd` runs as our effective user or root
// (SO_PEERCRED): abstract names carry no permissions, so anyone of the network namespace may hold or dial one.
// `pid`, if given: that process's pid, as our pid namespace sees it.
bool PeerIsUsOrRoot(int fd, pid_t* pid = nullptr);

}  // namespace uroce::wire
