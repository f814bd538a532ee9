// A librpma server and client of our own (librpma 1.2): the client reads the server's region (bytes checked), writes
// a new pattern into it, flushes it (visibility), sends a message and receives the server's answer; the server checks
// the written bytes and the message before it answers. Exit status 0 only when every check held.
//
//   rpma_check server PORT          listens on the device's own address; prints "listening ADDRESS PORT"
//   rpma_check client ADDRESS PORT
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <librpma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kRegion = 64 * 1024, kMessage = 64 };

#define CHECK(call)                                                                            \
  do {                                                                                         \
    int rc_ = (call);                                                                          \
    if (rc_ != 0) {                                                                            \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, rpma_err_2str(rc_));      \
      exit(2);                                                                                 \
    }                                                                                          \
  } while (0)

static unsigned char Pattern(size_t i, unsigned seed) { return (unsigned char)(i * 31 + seed); }

static int Matches(const unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != Pattern(i, seed)) return 0;
  return 1;
}

// Waits for one completion on the connection's CQ and checks its status and opcode.
static void Complete(struct rpma_conn* conn, enum ibv_wc_opcode opcode) {
  struct rpma_cq* cq;
  CHECK(rpma_conn_get_cq(conn, &cq));
  struct ibv_wc wc;
  int got = 0;
  while (got == 0) {
    int rc = rpma_cq_get_wc(cq, 1, &wc, &got);
    if (rc == RPMA_E_NO_COMPLETION) {
      CHECK(rpma_cq_wait(cq));
      continue;
    }
    CHECK(rc);
  }
  if (wc.status != IBV_WC_SUCCESS || wc.opcode != opcode) {
    fprintf(stderr, "completion: status %s opcode %d, want %d\n", ibv_wc_status_str(wc.status), wc.opcode, opcode);
    exit(3);
  }
}

static void WaitEvent(struct rpma_conn* conn, enum rpma_conn_event want) {
  enum rpma_conn_event e;
  CHECK(rpma_conn_next_event(conn, &e));
  if (e != want) {
    fprintf(stderr, "connection event %s, want %s\n", rpma_utils_conn_event_2str(e), rpma_utils_conn_event_2str(want));
    exit(4);
  }
}

// The device's own address (GID 0, IPv4-mapped), where librpma finds the device. The context stays open (the
// returned one, closed by the caller once librpma has the device): a uroce process's device address is chosen when
// the process first opens it, among the free ones, so a close and a reopen may land on another address while other
// processes of the host (tests running in parallel) take the first.
static struct ibv_context* DeviceAddress(char* out, size_t len) {
  struct ibv_device** list = ibv_get_device_list(NULL);
  struct ibv_context* ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
  union ibv_gid gid;
  if (ctx == NULL || ibv_query_gid(ctx, 1, 0, &gid) != 0) {
    fprintf(stderr, "no device\n");
    exit(2);
  }
  inet_ntop(AF_INET, gid.raw + 12, out, (socklen_t)len);
  ibv_free_device_list(list);
  return ctx;
}

static int Server(const char* port) {
  char addr[INET_ADDRSTRLEN];
  struct ibv_context* probe = DeviceAddress(addr, sizeof addr);
  struct ibv_context* ibv;
  CHECK(rpma_utils_get_ibv_context(addr, RPMA_UTIL_IBV_CONTEXT_LOCAL, &ibv));
  ibv_close_device(probe);
  struct rpma_peer* peer;
  CHECK(rpma_peer_new(ibv, &peer));
  unsigned char* region = aligned_alloc(4096, kRegion);
  unsigned char* messages = aligned_alloc(4096, 2 * kMessage);
  for (size_t i = 0; i < kRegion; ++i) region[i] = Pattern(i, 1);
  struct rpma_mr_local *mr, *msg_mr;
  CHECK(rpma_mr_reg(peer, region, kRegion,
                    RPMA_MR_USAGE_READ_SRC | RPMA_MR_USAGE_WRITE_DST | RPMA_MR_USAGE_FLUSH_TYPE_VISIBILITY, &mr));
  CHECK(rpma_mr_reg(peer, messages, 2 * kMessage, RPMA_MR_USAGE_SEND | RPMA_MR_USAGE_RECV, &msg_mr));
  size_t desc_size;
  CHECK(rpma_mr_get_descriptor_size(mr, &desc_size));
  unsigned char desc[256];
  CHECK(rpma_mr_get_descriptor(mr, desc));
  struct rpma_ep* ep;
  CHECK(rpma_ep_listen(peer, addr, port, &ep));
  printf("listening %s %s\n", addr, port);
  fflush(stdout);
  struct rpma_conn_req* req;
  CHECK(rpma_ep_next_conn_req(ep, NULL, &req));
  CHECK(rpma_conn_req_recv(req, msg_mr, 0, kMessage, NULL));
  struct rpma_conn_private_data pdata = {desc, (uint8_t)desc_size};
  struct rpma_conn* conn;
  CHECK(rpma_conn_req_connect(&req, &pdata, &conn));
  WaitEvent(conn, RPMA_CONN_ESTABLISHED);
  Complete(conn, IBV_WC_RECV);  // the client's message: sent after its write and flush completed
  int ok = Matches(messages, kMessage, 7) && Matches(region, kRegion, 2);
  for (size_t i = 0; i < kMessage; ++i) messages[kMessage + i] = Pattern(i, ok ? 9 : 0);
  CHECK(rpma_send(conn, msg_mr, kMessage, kMessage, RPMA_F_COMPLETION_ALWAYS, NULL));
  Complete(conn, IBV_WC_SEND);
  WaitEvent(conn, RPMA_CONN_CLOSED);
  CHECK(rpma_conn_disconnect(conn));
  CHECK(rpma_conn_delete(&conn));
  CHECK(rpma_ep_shutdown(&ep));
  CHECK(rpma_mr_dereg(&msg_mr));
  CHECK(rpma_mr_dereg(&mr));
  CHECK(rpma_peer_delete(&peer));
  printf("server: written bytes and message %s\n", ok ? "checked" : "WRONG");
  return ok ? 0 : 1;
}

static int Client(const char* addr, const char* port) {
  struct ibv_context* ibv;
  CHECK(rpma_utils_get_ibv_context(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE, &ibv));
  struct rpma_peer* peer;
  CHECK(rpma_peer_new(ibv, &peer));
  unsigned char* local = aligned_alloc(4096, kRegion);
  unsigned char* messages = aligned_alloc(4096, 2 * kMessage);
  struct rpma_mr_local *mr, *msg_mr;
  CHECK(rpma_mr_reg(peer, local, kRegion, RPMA_MR_USAGE_READ_DST | RPMA_MR_USAGE_WRITE_SRC, &mr));
  CHECK(rpma_mr_reg(peer, messages, 2 * kMessage, RPMA_MR_USAGE_SEND | RPMA_MR_USAGE_RECV, &msg_mr));
  struct rpma_conn_req* req;
  CHECK(rpma_conn_req_new(peer, addr, port, NULL, &req));
  CHECK(rpma_conn_req_recv(req, msg_mr, kMessage, kMessage, NULL));
  struct rpma_conn* conn;
  CHECK(rpma_conn_req_connect(&req, NULL, &conn));
  WaitEvent(conn, RPMA_CONN_ESTABLISHED);
  struct rpma_conn_private_data pdata;
  CHECK(rpma_conn_get_private_data(conn, &pdata));
  struct rpma_mr_remote* remote;
  CHECK(rpma_mr_remote_from_descriptor(pdata.ptr, pdata.len, &remote));
  // Read what the server put there.
  memset(local, 0, kRegion);
  CHECK(rpma_read(conn, mr, 0, remote, 0, kRegion, RPMA_F_COMPLETION_ALWAYS, NULL));
  Complete(conn, IBV_WC_RDMA_READ);
  int ok = Matches(local, kRegion, 1);
  // Write a new pattern, make it visible, tell the server.
  for (size_t i = 0; i < kRegion; ++i) local[i] = Pattern(i, 2);
  CHECK(rpma_write(conn, remote, 0, mr, 0, kRegion, RPMA_F_COMPLETION_ON_ERROR, NULL));
  CHECK(rpma_flush(conn, remote, 0, kRegion, RPMA_FLUSH_TYPE_VISIBILITY, RPMA_F_COMPLETION_ALWAYS, NULL));
  Complete(conn, IBV_WC_RDMA_READ);  // librpma's flush is a READ after the WRITE
  for (size_t i = 0; i < kMessage; ++i) messages[i] = Pattern(i, 7);
  CHECK(rpma_send(conn, msg_mr, 0, kMessage, RPMA_F_COMPLETION_ALWAYS, NULL));
  Complete(conn, IBV_WC_SEND);
  Complete(conn, IBV_WC_RECV);
  ok = ok && Matches(messages + kMessage, kMessage, 9);
  CHECK(rpma_conn_disconnect(conn));
  WaitEvent(conn, RPMA_CONN_CLOSED);
  CHECK(rpma_conn_delete(&conn));
  CHECK(rpma_mr_remote_delete(&remote));
  CHECK(rpma_mr_dereg(&msg_mr));
  CHECK(rpma_mr_dereg(&mr));
  CHECK(rpma_peer_delete(&peer));
  printf("client: read bytes and the server's answer %s\n", ok ? "checked" : "WRONG");
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "server") == 0) return Server(argv[2]);
  if (argc == 4 && strcmp(argv[1], "client") == 0) return Client(argv[2], argv[3]);
  fprintf(stderr, "usage: rpma_check server PORT | client ADDRESS PORT\n");
  return 2;
}
