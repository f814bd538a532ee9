#include "rdmacm/abstract_names.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace uroce::rdmacm {
namespace {

// sock_diag's dump of the namespace's UNIX sockets (sock_diag(7)): name and user of each. False if the kernel does
// not answer it (no NETLINK_SOCK_DIAG, or no UNIX_DIAG_UID before Linux 5.3: then no name carries a user).
bool ListWithSockDiag(std::string_view prefix, std::vector<AbstractName>* out) {
  const int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return false;
  struct {
    nlmsghdr header;
    unix_diag_req request;
  } query{};
  query.header.nlmsg_len = sizeof query;
  query.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  query.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  query.request.sdiag_family = AF_UNIX;
  query.request.udiag_states = ~0u;  // bound datagram sockets are "closed", announcements "listening": all of them
  query.request.udiag_show = UDIAG_SHOW_NAME | UDIAG_SHOW_UID;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd, &query, sizeof query, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) != ssize_t(sizeof query)) {
    close(fd);
    return false;
  }
  bool done = false, ok = true, saw_uid = false, saw_any = false;
  alignas(nlmsghdr) char buf[32768];
  while (!done && ok) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      break;
    }
    int left = int(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_type == NLMSG_DONE) {
        done = true;
        break;
      }
      if (h->nlmsg_type == NLMSG_ERROR) {
        ok = false;
        break;
      }
      const auto* msg = static_cast<const unix_diag_msg*>(NLMSG_DATA(h));
      int attrs_len = int(h->nlmsg_len) - int(NLMSG_LENGTH(sizeof *msg));
      std::optional<std::string> name;
      std::optional<uid_t> uid;
      for (auto* a = reinterpret_cast<rtattr*>(const_cast<unix_diag_msg*>(msg) + 1); RTA_OK(a, attrs_len);
           a = RTA_NEXT(a, attrs_len)) {
        const auto* data = static_cast<const char*>(RTA_DATA(a));
        const size_t len = RTA_PAYLOAD(a);
        if (a->rta_type == UNIX_DIAG_NAME && len > 0 && data[0] == '\0') name.emplace(data + 1, len - 1);
        if (a->rta_type == UNIX_DIAG_UID && len >= sizeof(uint32_t)) {
          uint32_t v;
          std::memcpy(&v, data, sizeof v);
          uid = uid_t(v);
        }
      }
      saw_any = true;
      saw_uid |= uid.has_value();
      if (name && std::string_view(*name).substr(0, prefix.size()) == prefix) out->push_back({*name, uid});
    }
  }
  close(fd);
  // A kernel that lists sockets without their users (before 5.3) is no better than /proc/net/unix.
  return ok && (saw_uid || !saw_any);
}

// /proc/net/unix lists abstract names as "@name" in its last column, without their holders.
void ListFromProc(std::string_view prefix, std::vector<AbstractName>* out) {
  std::ifstream in("/proc/net/unix");
  const std::string want = "@" + std::string(prefix);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find(want);
    if (at == std::string::npos || (at > 0 && line[at - 1] != ' ')) continue;
    std::string name = line.substr(at + 1);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\r')) name.pop_back();
    out->push_back({name, std::nullopt});
  }
}

}  // namespace

std::vector<AbstractName> AbstractNamesWithPrefix(std::string_view prefix) {
  std::vector<AbstractName> names;
  if (!ListWithSockDiag(prefix, &names)) {
    names.clear();
    ListFromProc(prefix, &names);
  }
  return names;
}

bool TrustedUser(uid_t uid) {
  if (uid == 0 || uid == geteuid() || uid == getuid()) return true;
  const char* list = std::getenv("UROCE_TRUSTED_UIDS");
  for (const char* p = list; p != nullptr && *p != '\0';) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(p, &end, 10);
    if (end == p) break;
    if (uid_t(v) == uid) return true;
    p = *end == ',' ? end + 1 : end;
  }
  return false;
}

}  // namespace uroce::rdmacm
