// EngineConfig: which address the host device takes (UROCE_DEVICE=host with UROCE_ADDR an address, a prefix, or
// nothing), read through LoadEngineConfig as a program's environment gives it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "verbs_api/engine.h"

namespace uroce::verbs {
namespace {

EngineConfig Load(const char* addr) {
  unsetenv("UROCE_CONFIG");  // /etc/uroce.conf, if a machine has one, sets neither key this test reads
  setenv("UROCE_DEVICE", "host", 1);
  if (addr != nullptr) {
    setenv("UROCE_ADDR", addr, 1);
  } else {
    unsetenv("UROCE_ADDR");
  }
  EngineConfig config;
  std::string error;
  EXPECT_EQ(LoadEngineConfig(&config, &error), 0) << error;
  EXPECT_TRUE(config.host_device);
  return config;
}

TEST(EngineConfig, TheHostDeviceTakesTheAddressGivenOr127001) {
  EXPECT_EQ(Load(nullptr).HostDeviceAddress(), wire::IpAddress::V4(0x7f000001));
  EXPECT_EQ(Load("127.0.0.9").HostDeviceAddress(), wire::IpAddress::V4(0x7f000009));
}

// With a prefix, the lowest of this host's addresses inside it: every process of the host comes to the same one, so
// that one UROCE_ADDR serves every host of a job. The loopback interface has 127.0.0.1 wherever this runs.
TEST(EngineConfig, WithAPrefixTheHostDeviceTakesTheLowestOfTheHostsAddressesThere) {
  EXPECT_EQ(Load("127.0.0.0/8").HostDeviceAddress(), wire::IpAddress::V4(0x7f000001));
  // Below the limited broadcast address: no interface has an address there.
  EXPECT_EQ(Load("255.255.255.0/24").HostDeviceAddress(), std::nullopt);
}

}  // namespace
}  // namespace uroce::verbs
