// EngineConfig: which device a process gets (the host device unless UROCE_DEVICE=process; chosen or by default) and
// which address the host device takes (UROCE_ADDR an address, a prefix, or nothing), read through LoadEngineConfig as
// a program's environment gives it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <string>

#include "verbs_api/engine.h"

namespace uroce::verbs {
namespace {

// Sets (or, for nullptr, unsets) one variable.
void SetOrUnset(const char* name, const char* value) {
  if (value != nullptr) {
    setenv(name, value, 1);
  } else {
    unsetenv(name);
  }
}

// The configuration a program's environment gives with UROCE_DEVICE `device` and UROCE_ADDR `addr`.
EngineConfig Load(const char* device, const char* addr) {
  unsetenv("UROCE_CONFIG");  // /etc/uroce.conf, if a machine has one, sets neither key this test reads
  SetOrUnset("UROCE_DEVICE", device);
  SetOrUnset("UROCE_ADDR", addr);
  EngineConfig config;
  std::string error;
  EXPECT_EQ(LoadEngineConfig(&config, &error), 0) << error;
  return config;
}

// The host device's, with UROCE_ADDR `addr`.
EngineConfig Load(const char* addr) {
  EngineConfig config = Load("host", addr);
  EXPECT_TRUE(config.host_device);
  return config;
}

TEST(EngineConfig, TheHostDeviceIsTheDefaultAndUroceDeviceChooses) {
  EngineConfig config = Load(nullptr, nullptr);
  EXPECT_TRUE(config.host_device);
  EXPECT_FALSE(config.device_chosen);  // so a process that cannot share it gets a device of its own
  config = Load("", nullptr);
  EXPECT_TRUE(config.host_device);
  EXPECT_FALSE(config.device_chosen);
  config = Load("host", nullptr);
  EXPECT_TRUE(config.host_device);
  EXPECT_TRUE(config.device_chosen);
  config = Load("process", nullptr);
  EXPECT_FALSE(config.host_device);
  EXPECT_TRUE(config.device_chosen);
  setenv("UROCE_DEVICE", "nic", 1);
  std::string error;
  EXPECT_EQ(LoadEngineConfig(&config, &error), EINVAL);
  EXPECT_NE(error.find("bad device 'nic'"), std::string::npos) << error;
}

// Unpinned, the host's address (DefaultHostAddress): here one of this host's non-loopback addresses, or 127.0.0.1
// where it has none (tests/host_device_test.sh checks which in namespaces it makes).
TEST(EngineConfig, TheHostDeviceTakesTheAddressGivenOrTheHosts) {
  const wire::IpAddress host = DefaultHostAddress();
  EXPECT_EQ(Load(nullptr).HostDeviceAddress(), host);
  EXPECT_EQ(Load("127.0.0.9").HostDeviceAddress(), wire::IpAddress::V4(0x7f000009));
  if (host != wire::IpAddress::V4(0x7f000001)) {
    EXPECT_FALSE(host.is_v4() && (host.v4() >> 24) == 127) << host.ToString();
    EXPECT_NE(host, *wire::IpAddress::Parse("::1"));
  }
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
