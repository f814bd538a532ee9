// The abstract UNIX socket names (unix(7), "abstract namespace") through which the uroce processes of a host find each
// other without a daemon: the rdma_cm port registry (port_registry.h) and the device announcements (peer_watch.h).
// Abstract names are first come, first served, and any process of the network namespace may bind one: a name says
// nothing about who holds it. What does is the holder's user, which the kernel reports for every socket (sock_diag,
// UNIX_DIAG_UID) and for the peer of a connected socket (SO_PEERCRED). A name held by a user this process does not
// trust is not uroce's, whatever it says.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace uroce::rdmacm {

struct AbstractName {
  std::string name;          // without the leading NUL
  std::optional<uid_t> uid;  // the holder's user; none where the kernel cannot say (no sock_diag: /proc/net/unix)
};

// Every abstract name of this network namespace that begins with `prefix`, with its holder's user.
std::vector<AbstractName> AbstractNamesWithPrefix(std::string_view prefix);

// Whether names held by `uid` are believed: this process's own user, root, or one listed in UROCE_TRUSTED_UIDS
// (comma-separated numbers, for uroce programs of several users that talk to each other).
bool TrustedUser(uid_t uid);

// The same for a name as listed: one whose holder is unknown is believed (the kernel has no sock_diag for UNIX
// sockets, Linux < 5.3, and nothing better can be known).
inline bool Trusted(const AbstractName& n) { return !n.uid || TrustedUser(*n.uid); }

}  // namespace uroce::rdmacm
