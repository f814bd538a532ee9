// The versioned C table between librdmacm and libibverbs (verbs_api/cm_export.h): libibverbs gives only the version
// asked for, and librdmacm refuses any other table -- one line on stderr, errno EPROTO from the first call that needs
// the device -- instead of calling it.
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "rdmacm/engine_cm.h"
#include "rdmacm/internal.h"
#include "verbs_api/cm_export.h"

namespace {

using uroce::rdmacm::CheckedCmOps;
using uroce::rdmacm::SetCmOpsLookupForTesting;

const uroce_cm_ops& RealOps() { return *uroce_get_cm_ops(UROCE_CM_ABI_VERSION); }

// A libibverbs of the next version: its table says so.
const uroce_cm_ops* NextVersion(uint32_t) {
  static uroce_cm_ops ops = [] {
    uroce_cm_ops o = RealOps();
    ++o.abi_version;
    return o;
  }();
  return &ops;
}

// A libibverbs that offers no table of the version asked for.
const uroce_cm_ops* NoSuchVersion(uint32_t) {
  errno = EPROTO;
  return nullptr;
}

// A libibverbs whose version was not bumped when a struct that crosses changed.
const uroce_cm_ops* OtherLayout(uint32_t) {
  static uroce_cm_ops ops = [] {
    uroce_cm_ops o = RealOps();
    o.layout.req += 8;
    return o;
  }();
  return &ops;
}

// What CheckedCmOps says of `lookup`'s table: its stderr, and whether it refused with EPROTO.
std::string Refusal(uroce::rdmacm::CmOpsLookup lookup) {
  errno = 0;
  testing::internal::CaptureStderr();
  const uroce_cm_ops* ops = CheckedCmOps(lookup);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(ops, nullptr);
  EXPECT_EQ(errno, EPROTO);
  return said;
}

TEST(CmAbi, LibibverbsGivesTheVersionAskedForAndNoOther) {
  const uroce_cm_ops* ops = uroce_get_cm_ops(UROCE_CM_ABI_VERSION);
  ASSERT_NE(ops, nullptr);
  EXPECT_EQ(ops->abi_version, UROCE_CM_ABI_VERSION);
  EXPECT_EQ(ops->size, sizeof(uroce_cm_ops));
  EXPECT_EQ(ops->layout.event, sizeof(uroce::emu::CmEvent));
  EXPECT_EQ(ops->layout.req, sizeof(uroce::wire::CmReq));
  for (uint32_t wrong : {0u, UROCE_CM_ABI_VERSION + 1, 0xFFFFFFFFu}) {
    errno = 0;
    EXPECT_EQ(uroce_get_cm_ops(wrong), nullptr) << wrong;
    EXPECT_EQ(errno, EPROTO) << wrong;
  }
}

TEST(CmAbi, LibrdmacmTakesTheTableOfItsOwnBuild) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(CheckedCmOps(&uroce_get_cm_ops), &RealOps());
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(CmAbi, LibrdmacmRefusesAnotherTableWithOneLine) {
  const std::string prefix = "uroce: librdmacm.so.1 was built for CM ABI version " +
                             std::to_string(UROCE_CM_ABI_VERSION) + " of libibverbs.so.1, but ";
  for (auto [lookup, reason] : {std::pair{&NextVersion, "gave version " + std::to_string(UROCE_CM_ABI_VERSION + 1)},
                                std::pair{&NoSuchVersion, std::string("does not offer it")},
                                std::pair{&OtherLayout, std::string("passes CM structs of other sizes")}}) {
    const std::string said = Refusal(lookup);
    EXPECT_EQ(said.rfind(prefix, 0), 0u) << said;
    EXPECT_NE(said.find(reason), std::string::npos) << said;
    EXPECT_NE(said.find("use the librdmacm.so.1 and libibverbs.so.1 of one uroce build\n"), std::string::npos)
        << said;
    EXPECT_EQ(said.find('\n'), said.size() - 1) << "one line: " << said;
  }
  EXPECT_NE(Refusal(nullptr).find("has no uroce_get_cm_ops"), std::string::npos);
}

// The first calls that need the device fail with EPROTO, the first with the message, before anything of the table
// is called; with the right table the same process then opens the device.
TEST(CmAbi, AMismatchFailsTheFirstCallsCleanly) {
  SetCmOpsLookupForTesting(&NextVersion);
  testing::internal::CaptureStderr();
  errno = 0;
  EXPECT_EQ(rdma_create_event_channel(), nullptr);
  EXPECT_EQ(errno, EPROTO);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("uroce: librdmacm.so.1 was built for CM ABI version"), std::string::npos) << said;
  rdma_cm_id* id = nullptr;
  testing::internal::CaptureStderr();
  errno = 0;
  EXPECT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), -1);
  EXPECT_EQ(errno, EPROTO);
  EXPECT_EQ(id, nullptr);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "") << "said once per process";

  SetCmOpsLookupForTesting(nullptr);
  rdma_event_channel* channel = rdma_create_event_channel();
  ASSERT_NE(channel, nullptr) << strerror(errno);
  rdma_destroy_event_channel(channel);
}

}  // namespace
