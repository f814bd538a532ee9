// The exported helpers (verbs_api/helper_verbs.cc) against rdma-core v44's documented results: the sysfs path and
// file reader, rate conversions, L2 resolution of this host's and multicast GIDs, the kernel-ABI copies.
#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <stdlib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>

#include "verbs_api/verbs_test_env.h"

extern "C" {
// Not declared by verbs.h (rdma-core's driver.h, sysfs.h and marshall.h declare them).
const char* ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);
void ibv_copy_qp_attr_from_kern(ibv_qp_attr* dst, ib_uverbs_qp_attr* src);
void ibv_copy_path_rec_from_kern(ibv_sa_path_rec* dst, ib_user_path_rec* src);
void ibv_copy_path_rec_to_kern(ib_user_path_rec* dst, ibv_sa_path_rec* src);
int ibv_dontfork_range(void* base, size_t size);
int ibv_dofork_range(void* base, size_t size);
}

namespace {

using Env = uroce::verbs::testing::VerbsEnv;

TEST(HelperVerbs, SysfsPathIsSysUnlessSysfsPathSaysOtherwise) {
  // Read once per process, as rdma-core: this test's environment has no SYSFS_PATH.
  EXPECT_STREQ(ibv_get_sysfs_path(), "/sys");
}

TEST(HelperVerbs, ReadSysfsFileStripsTheNewlineAndRefusesToTruncate) {
  const std::string dir = ::testing::TempDir();
  std::ofstream(dir + "/value") << "0x1234\n";
  char buf[16];
  EXPECT_EQ(ibv_read_sysfs_file(dir.c_str(), "value", buf, sizeof buf), 6);
  EXPECT_STREQ(buf, "0x1234");
  char tiny[3];
  EXPECT_EQ(ibv_read_sysfs_file(dir.c_str(), "value", tiny, sizeof tiny), -1);
  EXPECT_EQ(ibv_read_sysfs_file(dir.c_str(), "absent", buf, sizeof buf), -1);
}

TEST(HelperVerbs, RatesConvertBothWays) {
  EXPECT_EQ(ibv_rate_to_mult(IBV_RATE_2_5_GBPS), 1);
  EXPECT_EQ(ibv_rate_to_mult(IBV_RATE_120_GBPS), 48);
  EXPECT_EQ(ibv_rate_to_mult(IBV_RATE_400_GBPS), 160);
  EXPECT_EQ(ibv_rate_to_mult(IBV_RATE_14_GBPS), -1) << "not a multiple of 2.5 Gb/s";
  EXPECT_EQ(mult_to_ibv_rate(4), IBV_RATE_10_GBPS);
  EXPECT_EQ(mult_to_ibv_rate(3), IBV_RATE_MAX);
  EXPECT_EQ(ibv_rate_to_mbps(IBV_RATE_100_GBPS), 103125);
  EXPECT_EQ(ibv_rate_to_mbps(IBV_RATE_MAX), -1);
  EXPECT_EQ(mbps_to_ibv_rate(25781), IBV_RATE_25_GBPS);
  EXPECT_EQ(mbps_to_ibv_rate(25000), IBV_RATE_MAX);
}

TEST(HelperVerbs, ForkRangesNeedNothing) {
  char b[64];
  EXPECT_EQ(ibv_dontfork_range(b, sizeof b), 0);
  EXPECT_EQ(ibv_dofork_range(b, sizeof b), 0);
}

TEST(HelperVerbs, KernelAbiCopies) {
  ib_uverbs_qp_attr k{};
  k.qkey = 0x1234;
  k.sq_psn = 77;
  k.max_send_wr = 9;
  k.ah_attr.grh.flow_label = 5;
  k.ah_attr.grh.dgid[15] = 1;
  k.ah_attr.is_global = 1;
  k.retry_cnt = 7;
  ibv_qp_attr a{};
  ibv_copy_qp_attr_from_kern(&a, &k);
  EXPECT_EQ(a.qkey, 0x1234u);
  EXPECT_EQ(a.sq_psn, 77u);
  EXPECT_EQ(a.cap.max_send_wr, 9u);
  EXPECT_EQ(a.ah_attr.grh.flow_label, 5u);
  EXPECT_EQ(a.ah_attr.grh.dgid.raw[15], 1);
  EXPECT_EQ(a.ah_attr.is_global, 1);
  EXPECT_EQ(a.retry_cnt, 7);
  ib_user_path_rec p{};
  p.dgid[0] = 0xfe;
  p.pkey = 0xffff;
  p.mtu = 5;
  p.packet_life_time = 18;
  ibv_sa_path_rec s{};
  ibv_copy_path_rec_from_kern(&s, &p);
  EXPECT_EQ(s.dgid.raw[0], 0xfe);
  EXPECT_EQ(s.pkey, 0xffff);
  EXPECT_EQ(s.mtu, 5);
  EXPECT_EQ(s.packet_life_time, 18);
  ib_user_path_rec back{};
  ibv_copy_path_rec_to_kern(&back, &s);
  EXPECT_EQ(0, std::memcmp(&back, &p, sizeof p));
}

// This host's address (the device's GID, on lo) resolves to lo's MAC, all zeros, with no VLAN (0xffff); a multicast
// group to its Ethernet multicast address.
TEST(HelperVerbs, ResolveEthL2OfThisHostAndOfAGroup) {
  Env env;
  ASSERT_NE(env.ctx, nullptr);
  ibv_ah_attr attr{};
  attr.port_num = 1;
  attr.is_global = 1;
  attr.grh.dgid = env.gid;
  uint8_t mac[6] = {1, 1, 1, 1, 1, 1};
  uint16_t vid = 0;
  ASSERT_EQ(ibv_resolve_eth_l2_from_gid(env.ctx, &attr, mac, &vid), 0);
  const uint8_t zero[6] = {};
  EXPECT_EQ(0, std::memcmp(mac, zero, 6));
  EXPECT_EQ(vid, 0xffff);
  const uint8_t group[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 129, 2, 3};
  std::memcpy(attr.grh.dgid.raw, group, 16);
  ASSERT_EQ(ibv_resolve_eth_l2_from_gid(env.ctx, &attr, mac, &vid), 0);
  const uint8_t expected[6] = {0x01, 0x00, 0x5e, 0x01, 0x02, 0x03};  // the group's low 23 bits
  EXPECT_EQ(0, std::memcmp(mac, expected, 6));
  attr.grh.sgid_index = 200;
  EXPECT_NE(ibv_resolve_eth_l2_from_gid(env.ctx, &attr, mac, &vid), 0) << "a GID index the port does not have";
}

TEST(HelperVerbs, EceAndDmabufAreNotSupported) {
  ibv_ece ece{};
  EXPECT_EQ(ibv_query_ece(nullptr, &ece), EOPNOTSUPP);
  EXPECT_EQ(ibv_set_ece(nullptr, &ece), EOPNOTSUPP);
  ece.comp_mask = 1;
  EXPECT_EQ(ibv_set_ece(nullptr, &ece), EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_dmabuf_mr(nullptr, 0, 4096, 0, -1, 0), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

}  // namespace
