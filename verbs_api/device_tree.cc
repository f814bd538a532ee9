#include "verbs_api/device_tree.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "verbs_api/engine.h"

namespace uroce::verbs {
namespace {

// The device's numbers, where ibv_query_device / ibv_query_port take them from (device_verbs.cc).
constexpr const char* kFirmware = "uroce 0.1";

// Writes `text` and a newline to `path` through a temporary file renamed over it: a reader sees the old file or the
// new one, never half of it.
int WriteFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." +
                          std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  FILE* f = fopen(tmp.c_str(), "w");
  if (f == nullptr) return errno;
  const bool ok = fputs(text.c_str(), f) >= 0 && fputc('\n', f) != EOF;
  if (fclose(f) != 0 || !ok) {
    unlink(tmp.c_str());
    return EIO;
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return err;
  }
  return 0;
}

// mkdir -p.
int MakeFolders(const std::string& path) {
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at != path.size() && path[at] != '/') continue;
    const std::string part = path.substr(0, at);
    if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return errno;
  }
  return 0;
}

int Link(const std::string& target, const std::string& path) {
  if (symlink(target.c_str(), path.c_str()) != 0 && errno != EEXIST) return errno;
  return 0;
}

// A GUID as sysfs prints it: four groups of four hex digits.
std::string GuidText(uint64_t guid) {
  char b[24];
  std::snprintf(b, sizeof b, "%04x:%04x:%04x:%04x", unsigned(guid >> 48) & 0xffff, unsigned(guid >> 32) & 0xffff,
                unsigned(guid >> 16) & 0xffff, unsigned(guid) & 0xffff);
  return b;
}

// A GID as sysfs prints it (%pI6): eight groups of four hex digits.
std::string GidText(const std::array<uint8_t, 16>& gid) {
  std::string out;
  char b[8];
  for (int i = 0; i < 16; i += 2) {
    std::snprintf(b, sizeof b, "%s%02x%02x", i ? ":" : "", gid[i], gid[i + 1]);
    out += b;
  }
  return out;
}

// The online CPUs as a sysfs cpumask ("00000003": comma-separated 32-bit words, highest first) and as a list
// ("0-1"): a software device is local to every CPU.
std::pair<std::string, std::string> OnlineCpus() {
  std::string list = "0";
  if (FILE* f = fopen("/sys/devices/system/cpu/online", "r")) {
    char b[256] = {};
    if (fgets(b, sizeof b, f)) list = std::string(b).substr(0, std::strcspn(b, "\n"));
    fclose(f);
  }
  std::vector<uint32_t> words(1);
  for (size_t at = 0; at < list.size();) {
    unsigned lo = 0, hi = 0;
    int used = 0;
    if (std::sscanf(list.c_str() + at, "%u%n", &lo, &used) != 1) break;
    at += size_t(used);
    hi = lo;
    if (at < list.size() && list[at] == '-') {
      ++at;
      if (std::sscanf(list.c_str() + at, "%u%n", &hi, &used) != 1) break;
      at += size_t(used);
    }
    for (unsigned cpu = lo; cpu <= hi && cpu < 8192; ++cpu) {
      if (words.size() <= cpu / 32) words.resize(cpu / 32 + 1);
      words[cpu / 32] |= 1u << (cpu % 32);
    }
    if (at < list.size() && list[at] == ',') ++at;
  }
  std::string mask;
  char b[16];
  for (size_t i = words.size(); i-- > 0;) {
    std::snprintf(b, sizeof b, "%s%08x", mask.empty() ? "" : ",", words[i]);
    mask += b;
  }
  return {mask, list};
}

// `gids`: the populated entries of the GID table (index, address), entry 0 first; empty while the device's address is
// not known yet.
int WriteTree(const std::string& root, const GidList& gids, bool host_device) {
  const std::optional<wire::IpAddress> address =
      !gids.empty() && gids[0].first == 0 ? std::optional<wire::IpAddress>(gids[0].second) : std::nullopt;
  const std::string dev = root + "/sys/devices/virtual/infiniband/uroce0";
  const std::string port = dev + "/ports/1";
  const std::string uverbs = root + "/sys/devices/virtual/infiniband_verbs/uverbs0";
  for (const std::string& folder :
       {port + "/gids", port + "/pkeys", port + "/gid_attrs/types", port + "/gid_attrs/ndevs", dev + "/device", uverbs,
        root + "/sys/class/infiniband", root + "/sys/class/infiniband_verbs", root + "/dev/infiniband"}) {
    if (int err = MakeFolders(folder)) return err;
  }
  const uint64_t guid = NodeGuid();
  const Netdev netdev = address ? NetdevOf(*address) : NetdevOf(wire::IpAddress::V4(0x7f000001));
  const auto [cpu_mask, cpu_list] = OnlineCpus();
  const std::pair<std::string, std::string> files[] = {
      {dev + "/node_type", "1: CA"},
      {dev + "/node_guid", GuidText(guid)},
      {dev + "/sys_image_guid", GuidText(guid)},
      {dev + "/node_desc", "uroce0"},
      {dev + "/fw_ver", kFirmware},
      {dev + "/hw_rev", "1"},
      {dev + "/device/numa_node", "-1"},
      {dev + "/device/local_cpus", cpu_mask},
      {dev + "/device/local_cpulist", cpu_list},
      {port + "/state", "4: ACTIVE"},
      {port + "/phys_state", "5: LinkUp"},
      {port + "/link_layer", "Ethernet"},
      {port + "/rate", "100 Gb/sec (4X EDR)"},  // active_width 4X, active_speed EDR (QueryPort)
      {port + "/lid", "0x0"},
      {port + "/sm_lid", "0x0"},
      {port + "/lmc", "0"},
      {port + "/sm_sl", "0"},
      {port + "/cap_mask", "0x00000000"},
      {port + "/pkeys/0", "0xffff"},
      {uverbs + "/ibdev", "uroce0"},
      {uverbs + "/abi_version", "1"},
      {uverbs + "/dev", "231:192"},
      {root + "/sys/class/infiniband_verbs/abi_version", "6"},
      // Placeholders for the listing: the shim answers these two with /dev/null, a character device.
      {root + "/dev/infiniband/uverbs0", ""},
      {root + "/dev/infiniband/rdma_cm", ""},
  };
  for (const auto& [path, text] : files) {
    if (int err = WriteFile(path, text)) return err;
  }
  // The netdev of a host device (the address is the host's, shared by its processes, as a RoCE device's netdev
  // is): rdma-core's pyverbs rdmacm tests take the device's IP address from the first address of
  // device/net/<name>, and both of their processes bind it. A per-process device lists none: its address is its
  // own, which a second process cannot bind.
  if (host_device && !netdev.name.empty()) {
    if (int err = MakeFolders(dev + "/device/net/" + netdev.name)) return err;
  }
  // Every entry's GID in RoCEv2 form (the zero GID where empty), and a populated entry's type and interface (files an
  // empty entry lacks, as the kernel's read of them fails). Entry 0 is typed even before its address is known.
  for (uint32_t i = 0; i < emu::GidTable::kEntries; ++i) {
    std::array<uint8_t, 16> gid{};
    const auto at = std::find_if(gids.begin(), gids.end(), [i](const auto& e) { return e.first == i; });
    if (at != gids.end()) gid = at->second.bytes();
    const std::string n = std::to_string(i);
    if (int err = WriteFile(port + "/gids/" + n, GidText(gid))) return err;
    if (at == gids.end() && i != 0) {
      unlink((port + "/gid_attrs/types/" + n).c_str());
      unlink((port + "/gid_attrs/ndevs/" + n).c_str());
      continue;
    }
    if (int err = WriteFile(port + "/gid_attrs/types/" + n, "RoCE v2")) return err;
    const std::string ndev = at == gids.end() ? netdev.name : NetdevOf(at->second).name;
    if (int err = WriteFile(port + "/gid_attrs/ndevs/" + n, ndev)) return err;
  }
  if (int err = Link("../../devices/virtual/infiniband/uroce0", root + "/sys/class/infiniband/uroce0")) return err;
  if (int err = Link("../../devices/virtual/infiniband_verbs/uverbs0", root + "/sys/class/infiniband_verbs/uverbs0"))
    return err;
  return 0;
}

// The shim's tree of this process (discovery_preload.c exports uroce_preload_tree; looked up once), made first when
// `make` and there is none; nullptr without the shim.
const char* ShimTree(bool make = false) {
  using TreeFn = const char* (*)(int);
  static const auto fn = reinterpret_cast<TreeFn>(dlsym(RTLD_DEFAULT, "uroce_preload_tree"));
  return fn ? fn(make ? 1 : 0) : nullptr;
}

}  // namespace

Netdev NetdevOf(const wire::IpAddress& address) {
  Netdev found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr && found.name.empty(); a = a->ifa_next) {
      if (wire::IpAddressOf(a->ifa_addr) == address) found.name = a->ifa_name;
    }
    freeifaddrs(list);
  }
  if (found.name.empty() && address.is_loopback()) found.name = "lo";
  if (!found.name.empty()) found.index = if_nametoindex(found.name.c_str());
  return found;
}

int WriteDeviceTree(const std::string& root) {
  if (auto engine = Engine::Running())
    return WriteTree(root, engine->device().gids().Populated(), engine->membership() != nullptr);
  EngineConfig config;  // no engine yet: the pinned address, if any
  std::string error;
  const bool loaded = LoadEngineConfig(&config, &error) == 0;
  const bool pinned = loaded && !config.address_prefix_len;
  const bool host_device = loaded && config.host_device;
  std::optional<wire::IpAddress> address = pinned ? config.address : std::nullopt;
  if (host_device) address = config.HostDeviceAddress();  // known before the engine: also in a prefix, or its default
  return WriteTree(root, address ? GidList{{0, *address}} : GidList{}, host_device);
}

void RewriteDeviceTree(const GidList& gids, bool host_device) {
  if (const char* tree = ShimTree()) WriteTree(tree, gids, host_device);
}

void RefreshDeviceTree(const GidList& gids, bool host_device) {
  if (const char* tree = ShimTree()) {
    WriteTree(tree, gids, host_device);
  } else {
    ShimTree(/*make=*/true);  // written with the running engine's address
  }
}

void WriteCountersFile(const std::string& text) {
  if (const char* tree = ShimTree()) WriteFile(std::string(tree) + "/counters", text);
}

}  // namespace uroce::verbs

// For the discovery shim: writes the tree into `root` (its own folder for this process). 0 or an errno.
extern "C" int uroce_write_device_tree(const char* root) {
  if (root == nullptr) return EINVAL;
  try {
    return uroce::verbs::WriteDeviceTree(root);
  } catch (...) {
    return ENOMEM;
  }
}
