// What stream and datagram rsockets both have: one CQ for sends and receives with a completion channel, `slots`
// registered buffers each way, receives posted on every receive buffer (rsocket.h).
#include <fcntl.h>

#include "rdmacm/rsocket.h"

namespace uroce::rdmacm::rsockets {

int PostRecv(RSocket* rs, int slot) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(rs->recv_buf.data()) + uint64_t(slot) * rs->slot_bytes, rs->slot_bytes,
              rs->recv_mr->lkey};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = kRecvFlag | uint32_t(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(rs->qp(), &wr, &bad);
}

int SetUpBuffers(RSocket* rs, ibv_pd* pd) {
  rs->recv_buf.resize(size_t(rs->slots) * rs->slot_bytes);
  rs->send_buf.resize(size_t(rs->slots) * rs->slot_bytes);
  rs->recv_mr = ibv_reg_mr(pd, rs->recv_buf.data(), rs->recv_buf.size(), IBV_ACCESS_LOCAL_WRITE);
  rs->send_mr = ibv_reg_mr(pd, rs->send_buf.data(), rs->send_buf.size(), 0);
  if (rs->recv_mr == nullptr || rs->send_mr == nullptr) return errno ? errno : ENOMEM;
  for (int i = 0; i < rs->slots; ++i) {
    rs->free_send.push_back(i);
    if (int err = PostRecv(rs, i)) return err;
  }
  return 0;
}

int CreateCq(RSocket* rs, ibv_context* verbs) {
  rs->cq_channel = ibv_create_comp_channel(verbs);
  if (rs->cq_channel == nullptr) return errno ? errno : ENOMEM;
  fcntl(rs->cq_channel->fd, F_SETFL, fcntl(rs->cq_channel->fd, F_GETFL) | O_NONBLOCK);
  // Every receive and send slot, a stream's end of stream, its credit SENDs and one more.
  rs->cq = ibv_create_cq(verbs, 2 * rs->slots + 2 + kMaxCreditSendsInFlight, nullptr, rs->cq_channel, 0);
  return rs->cq == nullptr ? (errno ? errno : ENOMEM) : 0;
}

void DestroyCqChannel(RSocket* rs) {
  if (rs->cq_channel) ibv_destroy_comp_channel(rs->cq_channel);
  rs->cq_channel = nullptr;
}

bool TookSendOrFailure(RSocket* rs, const ibv_wc& wc) {
  const bool recv = wc.wr_id & kRecvFlag;
  const int slot = int(wc.wr_id & 0xFFFFFFFF);
  if (wc.status != IBV_WC_SUCCESS) {
    // Flushed after a disconnect, or the peer is gone: the stream has ended.
    if (!rs->peer_fin && !rs->stream.fin_sent) rs->error = ECONNRESET;
    rs->peer_fin = true;
  } else if (recv) {
    return false;
  }
  if (!recv && slot < rs->slots) rs->free_send.push_back(slot);  // the end of stream and credits take no slot
  return true;
}

void PollCq(RSocket* rs) {
  if (rs->cq == nullptr) return;
  ibv_wc wc[16];
  int n;
  bool any = false;
  while ((n = ibv_poll_cq(rs->cq, 16, wc)) > 0) {
    any = true;
    for (int i = 0; i < n; ++i) {
      if (rs->dgram) {
        OnDatagramCompletion(rs, wc[i]);
      } else {
        OnStreamCompletion(rs, wc[i]);
      }
    }
  }
  if (!any) return;
  if (!rs->dgram) SendWhatCreditsAllow(rs);
  WakeWaiters(rs);
}

}  // namespace uroce::rdmacm::rsockets
