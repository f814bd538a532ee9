// rdma_cm calls in one process, where their contract is subtler than what the rdmacm-utils clients exercise
// (tests/rdmacm_clients_test.cc runs those): what the frameworks built on librdmacm (libfabric, librpma) rely on.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include <cstring>

#include <gtest/gtest.h>

#include "rdmacm/run_with_deadline.h"

namespace {

using uroce::rdmacm::testing::RunWithDeadline;

sockaddr_in V4(uint32_t host_order_ip, uint16_t port = 0) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(host_order_ip);
  return a;
}

// The device's own address: GID index 0 in its IPv4-mapped form.
sockaddr_in DeviceAddress() {
  ibv_device** list = ibv_get_device_list(nullptr);
  EXPECT_NE(list, nullptr);
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  EXPECT_NE(ctx, nullptr);
  ibv_gid gid{};
  EXPECT_EQ(ibv_query_gid(ctx, 1, 0, &gid), 0);
  ibv_close_device(ctx);
  uint32_t ip;
  std::memcpy(&ip, gid.raw + 12, 4);
  return V4(ntohl(ip));
}

// libfabric and librpma resolve an id synchronously (no channel: the call returns once ADDR_RESOLVED arrived and
// keeps that event in id->event) and then move it to a channel with rdma_migrate_id. rdma-core acknowledges the kept
// event there; a migrate that waited for the application to acknowledge it would wait for ever.
TEST(RdmaMigrateId, SynchronousIdWithItsLastEventUnacknowledged) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = V4(INADDR_LOOPBACK, 7471);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  ASSERT_NE(id->event, nullptr) << "a synchronous id keeps its last event";
  EXPECT_EQ(id->event->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  rdma_event_channel* channel = rdma_create_event_channel();
  ASSERT_NE(channel, nullptr);
  int rc = -1;
  RunWithDeadline({[&] { rc = rdma_migrate_id(id, channel); }}, "rdma_migrate_id", std::chrono::seconds(10));
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(id->channel, channel);
  EXPECT_EQ(id->event, nullptr) << "the kept event is acknowledged by the migration";
  // The id now reports on the channel: resolving the route queues ROUTE_RESOLVED there.
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  rdma_cm_event* e = nullptr;
  ASSERT_EQ(rdma_get_cm_event(channel, &e), 0);
  EXPECT_EQ(e->event, RDMA_CM_EVENT_ROUTE_RESOLVED);
  EXPECT_EQ(e->id, id);
  ASSERT_EQ(rdma_ack_cm_event(e), 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(channel);
}

// A destination of the other IP family than every GID of the device (an IPv6 address that is not this host, from a
// device on an IPv4 address): no GID reaches it, and the resolution fails at once (ADDR_ERROR, ENODEV) as the
// kernel's does, instead of resolving and then timing out; the id stays bound and may resolve another.
TEST(RdmaResolveAddr, ADestinationOfAnotherFamilyThanTheDevicesIsAnAddressError) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in6 far{};
  far.sin6_family = AF_INET6;
  far.sin6_port = htons(7471);
  ASSERT_EQ(inet_pton(AF_INET6, "fd00:7::1", &far.sin6_addr), 1);
  errno = 0;
  EXPECT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&far), 2000), -1);
  EXPECT_EQ(errno, ENODEV);
  sockaddr_in dst = V4(INADDR_LOOPBACK, 7471);
  EXPECT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

// rdma_bind_addr to the device's own address attaches the device (id->verbs), as the kernel's does, also when that
// address is a loopback one; another loopback address (no device holds 127.1.0.1: the devices take 127.0.0.0/16)
// and the wildcard attach none. librpma's rpma_utils_get_ibv_context finds its device the first way; libfabric binds
// "localhost" and expects no device there.
TEST(RdmaBindAddr, TheDevicesOwnAddressAttachesIt) {
  struct Case {
    sockaddr_in addr;
    bool attaches;
  };
  for (const Case& c : {Case{DeviceAddress(), true}, Case{V4(0x7f010001), false}, Case{V4(INADDR_ANY), false}}) {
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &c.addr.sin_addr, text, sizeof text);
    SCOPED_TRACE(text);
    rdma_cm_id* id = nullptr;
    ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
    sockaddr_in addr = c.addr;
    ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&addr)), 0);
    if (c.attaches) {
      ASSERT_NE(id->verbs, nullptr);
      EXPECT_STREQ(ibv_get_device_name(id->verbs->device), "uroce0");
      EXPECT_EQ(id->port_num, 1);
    } else {
      EXPECT_EQ(id->verbs, nullptr);
    }
    EXPECT_EQ(rdma_destroy_id(id), 0);
  }
}

}  // namespace
