// A client that dies in the middle of the rdma_cm handshake, as a program killed a few milliseconds into it does:
// it sends its REQ (rdma_connect returns once it is on its way) and kills itself with SIGKILL before it can answer
// the passive side's REP with an RTU. The passive side must then get an event it can end on (its peer's kernel
// would have sent a REJ on the dead process's behalf), never wait for ever.
//
// Usage: cm_quitter ADDRESS PORT. Exit 1 (with a message) when the handshake could not start; otherwise it never
// exits by itself.
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static int Wait(struct rdma_event_channel* channel, enum rdma_cm_event_type want) {
  struct rdma_cm_event* event = NULL;
  if (rdma_get_cm_event(channel, &event) != 0) return -1;
  const int ok = event->event == want;
  if (!ok) fprintf(stderr, "cm_quitter: %s instead of %s\n", rdma_event_str(event->event), rdma_event_str(want));
  rdma_ack_cm_event(event);
  return ok ? 0 : -1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: cm_quitter ADDRESS PORT\n");
    return 2;
  }
  struct rdma_addrinfo hints, *where = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_port_space = RDMA_PS_TCP;
  struct rdma_event_channel* channel = rdma_create_event_channel();
  struct rdma_cm_id* id = NULL;
  if (rdma_getaddrinfo(argv[1], argv[2], &hints, &where) != 0 || channel == NULL ||
      rdma_create_id(channel, &id, NULL, RDMA_PS_TCP) != 0 ||
      rdma_resolve_addr(id, NULL, where->ai_dst_addr, 2000) != 0 || Wait(channel, RDMA_CM_EVENT_ADDR_RESOLVED) != 0 ||
      rdma_resolve_route(id, 2000) != 0 || Wait(channel, RDMA_CM_EVENT_ROUTE_RESOLVED) != 0) {
    perror("cm_quitter: resolving");
    return 1;
  }
  struct ibv_qp_init_attr qp;
  memset(&qp, 0, sizeof qp);
  qp.qp_type = IBV_QPT_RC;
  qp.cap.max_send_wr = qp.cap.max_recv_wr = 1;
  qp.cap.max_send_sge = qp.cap.max_recv_sge = 1;
  struct rdma_conn_param param;
  memset(&param, 0, sizeof param);
  param.responder_resources = param.initiator_depth = 1;
  param.retry_count = 7;
  if (rdma_create_qp(id, NULL, &qp) != 0 || rdma_connect(id, &param) != 0) {
    perror("cm_quitter: connecting");
    return 1;
  }
  printf("cm_quitter: REQ sent, dying\n");
  fflush(stdout);
  raise(SIGKILL);
  return 1;
}
