// The modify_qp table walked through the verbs API against live QPs (issue: "a conformance test walks the whole
// modify_qp table for RC, UC and UD: every transition, every required and optional bit, checking accept or EINVAL and
// that a rejected call changed nothing"). The table itself is checked against an independent transcription of the
// IBTA text in emu/qp_state_machine_test.cc; here the question is whether ibv_modify_qp / ibv_query_qp honour it.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstring>
#include <string>
#include <vector>

#include "emu/qp_state_machine.h"

namespace {

using uroce::emu::QpState;
using uroce::emu::QpType;

const char* StateName(ibv_qp_state s) {
  static const char* kNames[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return kNames[s];
}

// Every attribute valid, so that only the mask decides.
ibv_qp_attr ValidAttributes(ibv_qp* peer, const ibv_gid& gid) {
  ibv_qp_attr a{};
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qkey = 0x11111111;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  a.path_mtu = IBV_MTU_1024;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.rq_psn = 0x123;
  a.sq_psn = 0x456;
  a.max_rd_atomic = 1;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.dest_qp_num = peer->qp_num;
  a.en_sqd_async_notify = 1;
  a.path_mig_state = IBV_MIG_MIGRATED;
  return a;
}

class ModifyQpConformance : public ::testing::TestWithParam<ibv_qp_type> {
 protected:
  void SetUp() override {
    ibv_device** list = ibv_get_device_list(nullptr);
    ASSERT_NE(list, nullptr);
    ctx_ = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    ASSERT_NE(ctx_, nullptr);
    pd_ = ibv_alloc_pd(ctx_);
    cq_ = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
    ASSERT_NE(cq_, nullptr);
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid_), 0);
    buf_.resize(64);
    mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE);
    peer_ = NewQp();
  }
  void TearDown() override {
    if (peer_) ibv_destroy_qp(peer_);
    if (mr_) ibv_dereg_mr(mr_);
    if (cq_) ibv_destroy_cq(cq_);
    if (pd_) ibv_dealloc_pd(pd_);
    if (ctx_) ibv_close_device(ctx_);
  }

  ibv_qp* NewQp() {
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = cq_;
    init.qp_type = GetParam();
    init.cap = {8, 8, 1, 1, 0};
    return ibv_create_qp(pd_, &init);
  }

  // Drives a fresh QP into `target` along a path of valid transitions; nullptr if the type cannot reach it here.
  ibv_qp* QpIn(ibv_qp_state target) {
    ibv_qp* qp = NewQp();
    if (qp == nullptr) return nullptr;
    const QpType type = static_cast<QpType>(GetParam());
    ibv_qp_attr a = ValidAttributes(peer_, gid_);
    auto step = [&](ibv_qp_state next) {
      const auto rule = uroce::emu::RuleFor(static_cast<QpState>(qp->state), static_cast<QpState>(next), type);
      a.qp_state = next;
      return rule.valid && ibv_modify_qp(qp, &a, static_cast<int>(rule.required) | IBV_QP_STATE) == 0;
    };
    bool ok = true;
    if (target == IBV_QPS_ERR) {
      ok = step(IBV_QPS_INIT) && step(IBV_QPS_ERR);
    } else if (target == IBV_QPS_SQE) {
      // A UD/UC send that fails (bad lkey) takes the send queue to SQE (IBTA 10.3.1.5); RC has no SQE.
      ok = GetParam() != IBV_QPT_RC && step(IBV_QPS_INIT) && step(IBV_QPS_RTR) && step(IBV_QPS_RTS);
      if (ok) {
        ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), 8, mr_->lkey ^ 0xffff00};
        ibv_send_wr wr{}, *bad = nullptr;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        ibv_ah* ah = nullptr;
        if (GetParam() == IBV_QPT_UD) {
          ah = ibv_create_ah(pd_, &a.ah_attr);
          wr.wr.ud.ah = ah;
          wr.wr.ud.remote_qpn = peer_->qp_num;
          wr.wr.ud.remote_qkey = a.qkey;
        }
        ok = ibv_post_send(qp, &wr, &bad) == 0;
        ibv_wc wc;
        while (ibv_poll_cq(cq_, 1, &wc) > 0) {
        }
        if (ah) ibv_destroy_ah(ah);
        ibv_qp_attr q;
        ibv_qp_init_attr qi;
        ok = ok && ibv_query_qp(qp, &q, IBV_QP_STATE, &qi) == 0 && q.qp_state == IBV_QPS_SQE;
      }
    } else {
      static const ibv_qp_state kPath[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD};
      for (ibv_qp_state s : kPath) {
        if (s > target || !ok) break;
        if (s != IBV_QPS_RESET) ok = step(s);
      }
    }
    if (!ok) {
      ibv_destroy_qp(qp);
      return nullptr;
    }
    return qp;
  }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_qp* peer_ = nullptr;
  ibv_gid gid_{};
  std::vector<uint8_t> buf_;
};

// Bits the device refuses although the table lists them: alternate paths do not exist on RoCE (the kernel refuses
// them too), and no transition takes IBV_QP_CAP.
constexpr uint32_t kRefusedAnyway = IBV_QP_ALT_PATH | IBV_QP_CAP;

TEST_P(ModifyQpConformance, EveryTransitionEveryBit) {
  const QpType type = static_cast<QpType>(GetParam());
  int checked = 0;
  for (int c = IBV_QPS_RESET; c <= IBV_QPS_ERR; ++c) {
    for (int n = IBV_QPS_RESET; n <= IBV_QPS_ERR; ++n) {
      const auto cur = static_cast<ibv_qp_state>(c), next = static_cast<ibv_qp_state>(n);
      const auto rule = uroce::emu::RuleFor(static_cast<QpState>(cur), static_cast<QpState>(next), type);
      // The variants: the required mask, + each optional bit, - each required bit, + each foreign bit.
      struct Variant {
        uint32_t mask;
        bool accept;
      };
      std::vector<Variant> variants;
      const uint32_t base = rule.required | IBV_QP_STATE;
      variants.push_back({base, rule.valid});
      for (uint32_t bit = 1; bit < (1u << 21); bit <<= 1) {
        if (bit == IBV_QP_STATE) continue;
        if (rule.optional & bit) variants.push_back({base | bit, rule.valid && !(bit & kRefusedAnyway)});
        else if (rule.required & bit) variants.push_back({base & ~bit, false});
        else variants.push_back({base | bit, false});
      }
      for (const Variant& v : variants) {
        ibv_qp* qp = QpIn(cur);
        if (qp == nullptr) {
          // The state is not reachable for this type (SQE on RC): every transition from it is moot.
          ASSERT_TRUE(cur == IBV_QPS_SQE && GetParam() == IBV_QPT_RC) << StateName(cur);
          break;
        }
        ibv_qp_attr before{}, after{};
        ibv_qp_init_attr init{};
        ASSERT_EQ(ibv_query_qp(qp, &before, 0x1fffff, &init), 0);
        ibv_qp_attr a = ValidAttributes(peer_, gid_);
        a.qp_state = next;
        a.cur_qp_state = cur;
        const int rc = ibv_modify_qp(qp, &a, static_cast<int>(v.mask));
        SCOPED_TRACE(std::string(StateName(cur)) + "->" + StateName(next) + " mask=0x" + std::to_string(v.mask));
        if (v.accept) {
          EXPECT_EQ(rc, 0);
          EXPECT_EQ(qp->state, next);
        } else {
          EXPECT_EQ(rc, EINVAL);
          ASSERT_EQ(ibv_query_qp(qp, &after, 0x1fffff, &init), 0);
          EXPECT_EQ(0, std::memcmp(&before, &after, sizeof before)) << "a rejected modify changed the QP";
          EXPECT_EQ(qp->state, cur);
        }
        ++checked;
        ASSERT_EQ(ibv_destroy_qp(qp), 0);
      }
    }
  }
  EXPECT_GT(checked, 500);
}

// UCX sets grh.flow_label = ~0 when it moves a QP to RTR; HCAs and rxe keep the label's 20 bits (IBTA 8.3.1) and
// accept the modify, and so must we: an EINVAL here made UCX's rc_verbs fail "error modifying QP to RTR".
TEST_P(ModifyQpConformance, FlowLabelKeepsItsLowTwentyBits) {
  if (GetParam() == IBV_QPT_UD) GTEST_SKIP() << "a UD QP takes no address vector";
  ibv_qp* qp = QpIn(IBV_QPS_INIT);
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr a = ValidAttributes(peer_, gid_);
  a.qp_state = IBV_QPS_RTR;
  a.ah_attr.grh.flow_label = ~0u;
  const auto rule = uroce::emu::RuleFor(QpState::kInit, QpState::kRtr, static_cast<QpType>(GetParam()));
  ASSERT_EQ(ibv_modify_qp(qp, &a, static_cast<int>(rule.required) | IBV_QP_STATE), 0);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_AV, &qi), 0);
  EXPECT_EQ(q.ah_attr.grh.flow_label, 0xfffffu);
  ibv_ah_attr ah = a.ah_attr;
  ibv_ah* handle = ibv_create_ah(pd_, &ah);
  EXPECT_NE(handle, nullptr) << "an AH with the same label";
  if (handle) ibv_destroy_ah(handle);
  ASSERT_EQ(ibv_destroy_qp(qp), 0);
}

INSTANTIATE_TEST_SUITE_P(Types, ModifyQpConformance, ::testing::Values(IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD),
                         [](const auto& info) {
                           return std::string(info.param == IBV_QPT_RC   ? "RC"
                                              : info.param == IBV_QPT_UC ? "UC"
                                                                         : "UD");
                         });

}  // namespace
