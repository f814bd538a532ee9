// The host's addresses as a device that receives at all of them sees them (its GID table), and the news of their
// changes (rtnetlink(7): RTM_NEWADDR / RTM_DELADDR), so that the table follows them as the kernel's GID cache follows
// a netdev's addresses for rxe.
#pragma once

#include <string>
#include <vector>

#include "wire/address.h"

namespace uroce::wire {

// This host's (network namespace's) addresses a device may have as GIDs, lowest first: of interfaces that are up,
// not loopback, not link-local (169.254.0.0/16, fe80::/10). Up, not running: a link's carrier comes and goes (a
// veth's peer, a cable), and linkwatch reports it up to a second late, so processes started together would not all
// come to the same list. With `ifnames`, each one's interface name in a parallel list.
std::vector<IpAddress> UsableHostAddresses(std::vector<std::string>* ifnames = nullptr);

// The GIDs after entry `gid0` of a device that receives at every address of the host: the usable host addresses but
// gid0 itself, of both families (IPv4 before IPv6, each lowest first), as rxe lists its netdev's IPv4 and IPv6 ones.
std::vector<IpAddress> OtherGids(const IpAddress& gid0);

// A netlink socket (non-blocking, close-on-exec) that becomes readable when an address of this network namespace
// is added or removed; -errno where it cannot be had (a sandbox refusing netlink).
int OpenAddressChanges();
// Takes what is queued on such a socket; whether anything was (a change, or news lost to a full queue: ENOBUFS).
bool TakeAddressChanges(int fd);

}  // namespace uroce::wire
