// uroce0 as the kernel shows an RDMA device in sysfs and /dev, written as files into a folder: what frameworks read
// before (and besides) the verbs. UCX lists a device only if /dev/infiniband/<dev_name> is a character device it may
// read and write, and reads the RoCE version and netdev of a GID from ports/1/gid_attrs (without them it takes the
// GID for RoCE v1); Open MPI's openib BTL looks for <sysfs>/class/infiniband. The discovery shim
// (verbs_api/discovery_preload.c, which `uroce run` preloads) shows the folder in place of /sys/class/infiniband,
// /sys/class/infiniband_verbs, their /sys/devices/virtual targets and /dev/infiniband, whose uverbs0 and rdma_cm it
// answers with /dev/null (any character device will do, as UCX's own mocks use `mknod c 1 3`).
//
// Layout under ROOT (as on a host with a kernel RDMA device; values as ibv_devinfo reports them):
//   sys/class/infiniband/uroce0 -> ../../devices/virtual/infiniband/uroce0
//   sys/class/infiniband_verbs/abi_version, uverbs0 -> ../../devices/virtual/infiniband_verbs/uverbs0
//   sys/devices/virtual/infiniband/uroce0/{node_type,node_guid,sys_image_guid,node_desc,fw_ver,hw_rev}
//       ports/1/{state,phys_state,link_layer,rate,lid,sm_lid,lmc,sm_sl,cap_mask,pkeys/0,gids/0..15}
//       ports/1/gid_attrs/{types,ndevs}/0 (the populated entry)   device/{numa_node,local_cpus,local_cpulist}
//       device/net/<netdev of the address>/ (the host device only)
//   sys/devices/virtual/infiniband_verbs/uverbs0/{ibdev,abi_version,dev}
//   dev/infiniband/{uverbs0,rdma_cm}
//   counters   (the engine's counters while it runs, as UROCE_STATS prints them: `uroce stats` reads them)
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "wire/address.h"

namespace uroce::verbs {

// The network interface that holds `address`: its name and index, as the kernel names a RoCE GID's netdev. An
// address no interface lists but 127.0.0.0/8 and ::1 (every loopback address reaches this host through lo) is lo's;
// any other: {"", 0}.
struct Netdev {
  std::string name;
  unsigned index = 0;
};
Netdev NetdevOf(const wire::IpAddress& address);

// Writes (or rewrites: every file is replaced whole, so a reader never sees half of one) the tree under `root`,
// creating folders as needed. The GIDs are the running engine's table, else GID 0 alone: the pinned UROCE_ADDR (on
// the host device: else its default address), else the zero GID until the device opens. 0 or an errno.
int WriteDeviceTree(const std::string& root);

// The populated entries of a GID table: (index, address), by index (emu::GidTable::Populated).
using GidList = std::vector<std::pair<uint32_t, wire::IpAddress>>;

// The engine started, or its GID table changed (on the host device: `host_device`): rewrites the tree the discovery
// shim made for this process, if it made one.
void RefreshDeviceTree(const GidList& gids, bool host_device);
// The GID table changed: rewrites the tree the discovery shim made for this process, if it made one (never makes it).
void RewriteDeviceTree(const GidList& gids, bool host_device);

// Replaces the file `counters` at the root of this process's tree (if the shim made one) with `text`: the running
// engine's counters, for `uroce stats`.
void WriteCountersFile(const std::string& text);

}  // namespace uroce::verbs
