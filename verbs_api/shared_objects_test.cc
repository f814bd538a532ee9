// Objects reached from more than one handle: ibv_import_device / ibv_import_pd / ibv_import_mr / ibv_import_dm and
// their unimports (one process, several contexts on one device), parent domains (ibv_alloc_parent_domain(3)), and the
// rules of device-memory copies (ibv_memcpy_to_dm / ibv_memcpy_from_dm).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "verbs_api/verbs_test_env.h"

namespace {

using Env = uroce::verbs::testing::VerbsEnv;

bool FdOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

TEST(ImportDevice, ADupOfCmdFdOpensAContextThatOwnsIt) {
  Env e;
  ASSERT_NE(e.ctx, nullptr);
  ASSERT_GE(e.ctx->cmd_fd, 0);
  const int dup_fd = dup(e.ctx->cmd_fd);
  ASSERT_GE(dup_fd, 0);
  ibv_context* imported = ibv_import_device(dup_fd);
  ASSERT_NE(imported, nullptr) << strerror(errno);
  EXPECT_EQ(imported->cmd_fd, dup_fd);
  EXPECT_STREQ(ibv_get_device_name(imported->device), "uroce0");
  ibv_device_attr attr{};
  EXPECT_EQ(ibv_query_device(imported, &attr), 0);
  EXPECT_EQ(ibv_close_device(imported), 0);
  EXPECT_FALSE(FdOpen(dup_fd));          // ibv_import_device(3): closing the context closes the command fd
  EXPECT_TRUE(FdOpen(e.ctx->cmd_fd));    // the original's stays
}

TEST(ImportDevice, AnFdThatIsNotTheDeviceIsRefused) {
  const int efd = eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(efd, 0);
  errno = 0;
  EXPECT_EQ(ibv_import_device(efd), nullptr);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_TRUE(FdOpen(efd));  // a refused fd is not taken
  close(efd);
  errno = 0;
  EXPECT_EQ(ibv_import_device(efd), nullptr);
  EXPECT_EQ(errno, EBADF);
}

TEST(ImportPdMr, ImportedHandlesNameTheSameObjects) {
  Env e;
  ibv_context* other = ibv_import_device(dup(e.ctx->cmd_fd));
  ASSERT_NE(other, nullptr);
  std::vector<uint8_t> buf(4096);
  ibv_mr* mr = ibv_reg_mr(e.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);

  ibv_pd* pd2 = ibv_import_pd(other, e.pd->handle);
  ASSERT_NE(pd2, nullptr);
  EXPECT_EQ(pd2->handle, e.pd->handle);
  EXPECT_EQ(pd2->context, other);
  ibv_mr* mr2 = ibv_import_mr(pd2, mr->handle);
  ASSERT_NE(mr2, nullptr);
  EXPECT_EQ(mr2->lkey, mr->lkey);
  EXPECT_EQ(mr2->rkey, mr->rkey);
  EXPECT_EQ(mr2->length, mr->length);
  EXPECT_EQ(mr2->addr, nullptr);  // ibv_import_mr(3) NOTES
  EXPECT_EQ(mr2->pd, pd2);

  // An MR imported through a PD it does not belong to, or an unknown handle, is refused.
  ibv_pd* unrelated = ibv_alloc_pd(other);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(unrelated, mr->handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(other, 0xfffff0), nullptr);
  EXPECT_EQ(errno, EINVAL);

  // Unimporting forgets the handles only: the objects stay.
  ibv_unimport_mr(mr2);
  ibv_unimport_pd(pd2);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);

  // Deallocating through an imported handle destroys the PD for every handle.
  pd2 = ibv_import_pd(other, unrelated->handle);
  ASSERT_NE(pd2, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd2), 0);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(other, unrelated->handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_unimport_pd(unrelated);  // only the handle is left to forget
  EXPECT_EQ(ibv_close_device(other), 0);
}

TEST(ImportDm, ImportedDeviceMemorySharesTheBytes) {
  Env e;
  ibv_context* other = ibv_import_device(dup(e.ctx->cmd_fd));
  ASSERT_NE(other, nullptr);
  ibv_alloc_dm_attr attr{};
  attr.length = 256;
  ibv_dm* dm = ibv_alloc_dm(e.ctx, &attr);
  ASSERT_NE(dm, nullptr);
  const uint32_t handle = dm->handle;
  ibv_dm* dm2 = ibv_import_dm(other, handle);
  ASSERT_NE(dm2, nullptr);
  EXPECT_EQ(dm2->handle, dm->handle);
  std::vector<uint8_t> in(64, 0xab), out(64, 0);
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 128, in.data(), in.size()), 0);
  ASSERT_EQ(ibv_memcpy_from_dm(out.data(), dm2, 128, out.size()), 0);
  EXPECT_EQ(out, in);
  ibv_unimport_dm(dm2);
  EXPECT_EQ(ibv_free_dm(dm), 0);
  errno = 0;
  EXPECT_EQ(ibv_import_dm(other, handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_close_device(other), 0);
}

TEST(ImportDm, FreedDeviceMemoryCannotBeImported) {
  Env e;
  ibv_alloc_dm_attr attr{};
  attr.length = 64;
  ibv_dm* dm = ibv_alloc_dm(e.ctx, &attr);
  ASSERT_NE(dm, nullptr);
  const uint32_t handle = dm->handle;
  ibv_dm* imported = ibv_import_dm(e.ctx, handle);
  ASSERT_NE(imported, nullptr);
  EXPECT_EQ(ibv_free_dm(imported), 0);  // freeing through any handle destroys it
  errno = 0;
  EXPECT_EQ(ibv_import_dm(e.ctx, handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_unimport_dm(dm);
}

// Device memory is copied in 4-byte units within the allocation; anything else is EINVAL and copies nothing.
TEST(DeviceMemory, CopiesMustBeFourByteAlignedAndInRange) {
  Env e;
  ibv_alloc_dm_attr attr{};
  attr.length = 100;
  ibv_dm* dm = ibv_alloc_dm(e.ctx, &attr);
  ASSERT_NE(dm, nullptr);
  std::vector<uint8_t> buf(200, 0x11);
  struct Case {
    uint64_t offset;
    size_t length;
  } bad[] = {{3, 4}, {4, 3}, {1, 1}, {104, 4}, {0, 104}, {96, 8}, {~uint64_t{0} - 3, 8}};
  for (const Case& c : bad) {
    EXPECT_EQ(ibv_memcpy_to_dm(dm, c.offset, buf.data(), c.length), EINVAL) << c.offset << "+" << c.length;
    EXPECT_EQ(ibv_memcpy_from_dm(buf.data(), dm, c.offset, c.length), EINVAL) << c.offset << "+" << c.length;
  }
  std::vector<uint8_t> zeros(100, 0), out(100, 0xff);
  ASSERT_EQ(ibv_memcpy_from_dm(out.data(), dm, 0, 100), 0);
  EXPECT_EQ(out, zeros);  // none of the refused copies wrote
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 96, buf.data(), 4), 0);
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 100, buf.data(), 0), 0);
  EXPECT_EQ(ibv_free_dm(dm), 0);
}

int g_allocator_calls = 0;
void* CountingAlloc(ibv_pd*, void*, size_t, size_t, uint64_t) {
  ++g_allocator_calls;
  return IBV_ALLOCATOR_USE_DEFAULT;
}
void CountingFree(ibv_pd*, void*, void*, uint64_t) { ++g_allocator_calls; }

TEST(ParentDomain, StandsForItsPdAndKeepsItAlive) {
  Env e;
  ibv_parent_domain_init_attr attr{};
  attr.pd = e.pd;
  attr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  attr.alloc = CountingAlloc;
  attr.free = CountingFree;
  attr.pd_context = &attr;
  ibv_pd* parent = ibv_alloc_parent_domain(e.ctx, &attr);
  ASSERT_NE(parent, nullptr) << strerror(errno);
  EXPECT_EQ(parent->context, e.ctx);

  // Every verb that takes a PD takes the parent domain; what it creates belongs to the PD.
  std::vector<uint8_t> buf(4096);
  ibv_mr* mr = ibv_reg_mr(parent, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(mr->pd, parent);
  ibv_cq_init_attr_ex cq_attr{};
  cq_attr.cqe = 8;
  cq_attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  cq_attr.parent_domain = parent;
  ibv_cq_ex* cq = ibv_create_cq_ex(e.ctx, &cq_attr);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr qp_attr{};
  qp_attr.send_cq = qp_attr.recv_cq = ibv_cq_ex_to_cq(cq);
  qp_attr.qp_type = IBV_QPT_RC;
  qp_attr.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(parent, &qp_attr);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(qp->pd, parent);
  // The MR is in the PD: an imported handle of the PD finds it.
  ibv_pd* pd_again = ibv_import_pd(e.ctx, e.pd->handle);
  ASSERT_NE(pd_again, nullptr);
  ibv_mr* mr_again = ibv_import_mr(pd_again, mr->handle);
  EXPECT_NE(mr_again, nullptr);
  if (mr_again) ibv_unimport_mr(mr_again);
  ibv_unimport_pd(pd_again);

  EXPECT_EQ(ibv_dealloc_pd(e.pd), EBUSY);  // a parent domain still extends it
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
  EXPECT_EQ(g_allocator_calls, 0);  // queues live in the device's memory: the allocators are never needed
  // Env's destructor deallocates the PD, which is free again.
}

TEST(ParentDomain, BadAttributesAreEinval) {
  Env e;
  ibv_parent_domain_init_attr attr{};
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(e.ctx, &attr), nullptr);  // no PD
  EXPECT_EQ(errno, EINVAL);
  attr.pd = e.pd;
  attr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;  // without the callbacks
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(e.ctx, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  attr.comp_mask = 1u << 7;  // unknown
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(e.ctx, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // A CQ's IBV_CQ_INIT_ATTR_MASK_PD must name a parent domain, not a plain PD.
  ibv_cq_init_attr_ex cq_attr{};
  cq_attr.cqe = 4;
  cq_attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  cq_attr.parent_domain = e.pd;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(e.ctx, &cq_attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // No thread domains exist, so none can be given.
  EXPECT_EQ(ibv_alloc_td(e.ctx, nullptr), nullptr);
}

}  // namespace
