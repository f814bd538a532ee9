// Memory windows: ibv_alloc_mw, ibv_bind_mw (type 1), ibv_dealloc_mw, reached through ibv_context_ops; type 2 binds
// and LOCAL_INV arrive as send work requests (qp_verbs.cc).
#include <infiniband/verbs.h>

#include <cerrno>

#include "verbs_api/internal.h"
#include "verbs_api/verbs_table.h"

using namespace uroce;
using namespace uroce::verbs;

namespace uroce::verbs {

ibv_mw* AllocMw(ibv_pd* pd, ibv_mw_type type) {
  if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
    errno = EINVAL;
    return nullptr;
  }
  uint32_t rkey = 0;
  if (int err = ToContext(pd->context)->dev().AllocMw(ToPd(pd)->emu, static_cast<uint8_t>(type), &rkey)) {
    errno = err;
    return nullptr;
  }
  auto* mw = new ibv_mw{};
  mw->context = pd->context;
  mw->pd = pd;
  mw->rkey = rkey;
  mw->handle = rkey >> 8;
  mw->type = type;
  return mw;
}

int DeallocMw(ibv_mw* mw) {
  if (int err = ToContext(mw->context)->dev().DeallocMw(mw->rkey)) return err;
  delete mw;
  return 0;
}

emu::SendWr::Bind ToEmuBind(const ibv_mw& mw, uint32_t new_rkey, const ibv_mw_bind_info& info) {
  // IBV_ACCESS_* bits are emu::access bits (emu/types.h).
  return {mw.rkey, new_rkey, info.mr ? info.mr->lkey : 0, info.addr, info.length, info.mw_access_flags};
}

// ibv_bind_mw(3): a type 1 bind is a send-queue operation; the window's rkey changes when the call succeeds.
int BindMw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mw_bind) {
  if (mw->type != IBV_MW_TYPE_1) return EINVAL;
  const ibv_mw_bind_info& info = mw_bind->bind_info;
  ibv_send_wr wr{};
  wr.wr_id = mw_bind->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = mw_bind->send_flags;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = info;
  ibv_send_wr* bad = nullptr;
  if (int err = PostSend(qp, &wr, &bad)) return err;
  mw->rkey = wr.bind_mw.rkey;
  return 0;
}

}  // namespace uroce::verbs
