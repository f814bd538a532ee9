// import_share_check: ibv_import_device(3), ibv_import_pd(3) and ibv_import_mr(3) across processes of the host device,
// as rdma-core's shared-PD tests use them within one: an exporter passes its cmd_fd (SCM_RIGHTS) and the handles of a
// PD and a region; an importer works with that PD and region through its own QP. Run it under
// `uroce run --host-device`.
//
// The parent (the exporter) forks the importer; each opens the device after the fork. The exporter registers a buffer
// of its own memory in its PD (and a second region in another PD), and connects an RC QP of its own to the importer's,
// which the importer creates in the imported PD. Cases, each one line:
//   imported_handles   the imported context, PD and MR name the exporter's objects: the PD's handle, the MR's
//                      handle, keys and length are the exporter's (addr NULL, ibv_import_mr(3)); an fd that is not a
//                      device's is ENODEV, a PD handle the exporter has not EINVAL, an MR of the exporter's other PD
//                      EINVAL; deregistering or deallocating through the importer's handles is EOPNOTSUPP, and so
//                      is importing the exporter's device memory (ibv_import_dm)
//   receive_into       the exporter SENDs 3000 bytes; the importer's receive names the imported MR: they land in the
//                      exporter's buffer
//   send_from          the importer SENDs 5000 bytes gathered from the imported MR: the exporter receives its own
//                      buffer's bytes
//   write_and_read     the exporter WRITEs (2 packets' worth) through the importer's QP to the exporter's own R_Key,
//                      then READs it back through it: the bytes land in, and come back from, the exporter's buffer
//   after_dereg        the exporter deregisters the region: the importer's next SEND from it completes with
//                      IBV_WC_LOC_PROT_ERR, and importing it again is EINVAL
//   exporter_killed    a second exporter (its cmd_fd relayed by the first) is killed (-9) after the importer's SEND
//                      from its region delivered that region's bytes: the next SEND from it completes with
//                      IBV_WC_LOC_PROT_ERR at once, nothing hangs
// `import_share_check refused`, run where each process has a device of its own (the per-process device): the
// exporter's cmd_fd names a device the importer does not have:
//   refused            ibv_import_device of it is ENODEV
// Exit status 0 when every case passed.
#include <infiniband/verbs.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/verbs_process.h"

using namespace uroce;
using checks::Device;
using checks::Die;
using checks::Get;
using checks::Put;

namespace {

constexpr size_t kBufferBytes = 64 * 1024;
constexpr uint64_t kReceiveAt = 0, kSendFrom = 8192, kWriteAt = 16384;
constexpr uint32_t kReceiveBytes = 3000, kSendBytes = 5000, kWriteBytes = 6000;

// A case's outcome over the socket ("" when it passed): length, then bytes.
void PutText(int fd, const std::string& s) {
  Put<uint32_t>(fd, uint32_t(s.size()));
  if (!s.empty()) checks::SendAll(fd, s.data(), s.size());
}
std::string GetText(int fd) {
  std::string s(Get<uint32_t>(fd), '\0');
  if (!s.empty()) checks::ReceiveAll(fd, s.data(), s.size());
  return s;
}

uint8_t Pattern(int which, size_t j) { return uint8_t(j * 31 + which * 7 + 1); }

// What the exporter tells the importer (beside its cmd_fd).
struct Handles {
  uint32_t pd = 0;
  uint32_t mr = 0;
  uint32_t other_mr = 0;  // a region of the exporter's other PD
  uint32_t lkey = 0, rkey = 0;
  uint64_t length = 0;
  uint32_t qpn = 0;  // the exporter's QP
};

// A message of one byte with room for one descriptor (SCM_RIGHTS). Not copied: it points into itself.
struct FdMessage {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  FdMessage() {
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
  }
  FdMessage(const FdMessage&) = delete;
};

void SendFd(int sock, int fd) {
  FdMessage f;
  cmsghdr* c = CMSG_FIRSTHDR(&f.m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  if (sendmsg(sock, &f.m, 0) != 1) Die("sendmsg SCM_RIGHTS");
}

int ReceiveFd(int sock) {
  FdMessage f;
  if (recvmsg(sock, &f.m, 0) != 1) Die("recvmsg SCM_RIGHTS");
  cmsghdr* c = CMSG_FIRSTHDR(&f.m);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) Die("no descriptor came");
  int fd;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

ibv_qp* CreateQp(ibv_pd* pd, ibv_cq* cq) {
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 16;
  a.cap.max_send_sge = a.cap.max_recv_sge = 2;
  ibv_qp* qp = ibv_create_qp(pd, &a);
  if (qp == nullptr) Die("ibv_create_qp");
  return qp;
}

// "" when a completion of `status` came, else what came.
std::string Expect(ibv_cq* cq, ibv_wc_status status) {
  ibv_wc wc{};
  if (!checks::PollOne(cq, &wc, 20)) return "no completion in 20 s";
  if (wc.status == status) return "";
  return std::string("completion ") + ibv_wc_status_str(wc.status) + ", not " + ibv_wc_status_str(status);
}

int Post(ibv_qp* qp, ibv_wr_opcode op, uint64_t addr, uint32_t length, uint32_t lkey, uint64_t remote = 0,
         uint32_t rkey = 0) {
  ibv_sge sge{addr, length, lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = op;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  return ibv_post_send(qp, &wr, &bad);
}

int PostReceive(ibv_qp* qp, uint64_t addr, uint32_t length, uint32_t lkey) {
  ibv_sge sge{addr, length, lkey};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(qp, &wr, &bad);
}

void Report(const char* name, const std::string& problem, bool* ok) {
  if (problem.empty()) {
    printf("import_share_check: %s: ok\n", name);
  } else {
    printf("import_share_check: %s: FAILED: %s\n", name, problem.c_str());
    *ok = false;
  }
  fflush(stdout);
}

// The importer: reports each case as a string on `sock` ("" when it passed). `refused`: only that the exporter's
// cmd_fd is ENODEV.
void Importer(int sock, bool refused) {
  const int cmd_fd = ReceiveFd(sock);
  const Handles h = Get<Handles>(sock);
  std::string problem;
  if (refused) {
    errno = 0;
    ibv_context* ctx = ibv_import_device(cmd_fd);
    if (ctx != nullptr || errno != ENODEV) problem = "not ENODEV: " + std::string(strerror(errno));
    PutText(sock, problem);
    return;
  }
  auto note = [&](const std::string& p) {
    if (problem.empty()) problem = p;
  };
  // An fd that is not a device's names none.
  int not_device[2];
  if (pipe(not_device) != 0) Die("pipe");
  errno = 0;
  if (ibv_import_device(not_device[0]) != nullptr || errno != ENODEV) note("a pipe imported, or not ENODEV");
  close(not_device[0]);
  close(not_device[1]);
  ibv_context* ctx = ibv_import_device(cmd_fd);
  if (ctx == nullptr) Die("ibv_import_device of the exporter's cmd_fd");
  errno = 0;
  if (ibv_import_pd(ctx, h.pd + 1000) != nullptr || errno != EINVAL) note("a PD handle the exporter lacks: not EINVAL");
  ibv_pd* pd = ibv_import_pd(ctx, h.pd);
  if (pd == nullptr) Die("ibv_import_pd");
  if (pd->handle != h.pd) note("the imported PD's handle is not the exporter's");
  errno = 0;
  if (ibv_import_mr(pd, h.other_mr) != nullptr || errno != EINVAL) note("an MR of another PD imported, or not EINVAL");
  ibv_mr* mr = ibv_import_mr(pd, h.mr);
  if (mr == nullptr) Die("ibv_import_mr");
  if (mr->handle != h.mr || mr->lkey != h.lkey || mr->rkey != h.rkey || mr->length != h.length || mr->addr != nullptr)
    note("the imported MR's handle, keys, length or addr differ from the exporter's");
  if (ibv_dereg_mr(mr) != EOPNOTSUPP) note("ibv_dereg_mr of an imported MR is not EOPNOTSUPP");
  if (ibv_dealloc_pd(pd) != EOPNOTSUPP) note("ibv_dealloc_pd of an imported PD is not EOPNOTSUPP");
  errno = 0;
  if (ibv_import_dm(ctx, 1) != nullptr || errno != EOPNOTSUPP) note("ibv_import_dm through it is not EOPNOTSUPP");

  // Our QP, in the imported PD, connected to the exporter's.
  Device d;
  d.ctx = ctx;
  if (ibv_query_gid(ctx, 1, 0, &d.gid)) Die("ibv_query_gid");
  d.cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  if (d.cq == nullptr) Die("ibv_create_cq");
  ibv_qp* qp = CreateQp(pd, d.cq);
  Put(sock, qp->qp_num);
  checks::ConnectRc(d, qp, h.qpn, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  // The addresses a WR names in the region are its iova's: the exporter's buffer's addresses.
  const uint64_t base = Get<uint64_t>(sock);
  if (PostReceive(qp, base + kReceiveAt, kReceiveBytes, mr->lkey)) Die("ibv_post_recv");
  PutText(sock, problem);
  problem.clear();

  // receive_into: the exporter's SEND, into its own buffer through our receive.
  Get<char>(sock);
  note(Expect(d.cq, IBV_WC_SUCCESS));
  PutText(sock, problem);
  problem.clear();

  // send_from: our SEND, gathered from its buffer.
  Get<char>(sock);
  if (Post(qp, IBV_WR_SEND, base + kSendFrom, kSendBytes, mr->lkey)) Die("ibv_post_send");
  note(Expect(d.cq, IBV_WC_SUCCESS));
  PutText(sock, problem);
  problem.clear();

  // write_and_read: the exporter's WRITE and READ through our QP; nothing to do here.
  // after_dereg: the exporter deregistered the region.
  Get<char>(sock);
  if (Post(qp, IBV_WR_SEND, base + kSendFrom, 100, mr->lkey)) Die("ibv_post_send");
  note(Expect(d.cq, IBV_WC_LOC_PROT_ERR));
  errno = 0;
  if (ibv_import_mr(pd, h.mr) != nullptr || errno != EINVAL) note("a deregistered region imported again");
  ibv_unimport_mr(mr);
  PutText(sock, problem);
  problem.clear();

  // exporter_killed: the second exporter's PD and region, a QP of ours in that PD connected to the first exporter's
  // second QP.
  const int second_fd = ReceiveFd(sock);
  const Handles h2 = Get<Handles>(sock);
  const uint64_t base2 = Get<uint64_t>(sock);
  ibv_context* ctx2 = ibv_import_device(second_fd);
  ibv_pd* pd2 = ctx2 ? ibv_import_pd(ctx2, h2.pd) : nullptr;
  ibv_mr* mr2 = pd2 ? ibv_import_mr(pd2, h2.mr) : nullptr;
  if (mr2 == nullptr) Die("importing the second exporter's context, PD and region");
  ibv_qp* qp2 = CreateQp(pd2, d.cq);
  Put(sock, qp2->qp_num);
  checks::ConnectRc(d, qp2, h2.qpn, 0);
  Get<char>(sock);
  if (Post(qp2, IBV_WR_SEND, base2, kSendBytes, mr2->lkey)) Die("ibv_post_send");
  note(Expect(d.cq, IBV_WC_SUCCESS));
  PutText(sock, problem);
  Get<char>(sock);  // it is dead now
  const auto start = std::chrono::steady_clock::now();
  if (Post(qp2, IBV_WR_SEND, base2, 100, mr2->lkey)) Die("ibv_post_send");
  problem = Expect(d.cq, IBV_WC_LOC_PROT_ERR);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (problem.empty() && seconds > 5) problem = "the error took " + std::to_string(seconds) + " s";
  PutText(sock, problem);
  ibv_destroy_qp(qp2);
  ibv_unimport_mr(mr2);
  ibv_unimport_pd(pd2);
  ibv_close_device(ctx2);

  ibv_destroy_qp(qp);
  ibv_destroy_cq(d.cq);
  ibv_unimport_pd(pd);
  ibv_close_device(ctx);
}

}  // namespace


int main(int argc, char** argv) {
  checks::program = "import_share_check";
  const bool refused = argc > 1 && std::strcmp(argv[1], "refused") == 0;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) Die("socketpair");
  const pid_t importer = fork();
  if (importer < 0) Die("fork");
  if (importer == 0) {
    close(sv[0]);
    Importer(sv[1], refused);
    _exit(0);
  }
  close(sv[1]);
  const int sock = sv[0];
  // The second exporter, which exporter_killed kills: its cmd_fd, handles and buffer's address go to us, and we pass
  // them on.
  int ev[2];
  if (!refused && socketpair(AF_UNIX, SOCK_STREAM, 0, ev) != 0) Die("socketpair");
  pid_t second = -1;
  if (!refused && (second = fork()) < 0) Die("fork");
  if (second == 0) {
    close(ev[0]);
    close(sock);
    Device e = checks::OpenFirstDevice(4);
    std::vector<uint8_t> bytes(kSendBytes);
    for (size_t j = 0; j < bytes.size(); ++j) bytes[j] = Pattern(5, j);
    ibv_mr* region = ibv_reg_mr(e.pd, bytes.data(), bytes.size(), IBV_ACCESS_LOCAL_WRITE);
    if (region == nullptr) Die("ibv_reg_mr");
    SendFd(ev[1], e.ctx->cmd_fd);
    Put(ev[1], Handles{e.pd->handle, region->handle, 0, region->lkey, region->rkey, region->length, 0});
    Put(ev[1], uint64_t(reinterpret_cast<uintptr_t>(bytes.data())));
    Get<char>(ev[1]);  // killed meanwhile
    _exit(3);
  }
  if (!refused) close(ev[1]);

  // The exporter.
  Device d = checks::OpenFirstDevice(16);
  std::vector<uint8_t> buffer(kBufferBytes, 0), mine(kBufferBytes, 0);
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* mr = ibv_reg_mr(d.pd, buffer.data(), buffer.size(), access);
  ibv_mr* own = ibv_reg_mr(d.pd, mine.data(), mine.size(), access);
  ibv_pd* other_pd = ibv_alloc_pd(d.ctx);
  ibv_mr* other = other_pd ? ibv_reg_mr(other_pd, mine.data(), 4096, IBV_ACCESS_LOCAL_WRITE) : nullptr;
  if (mr == nullptr || own == nullptr || other == nullptr) Die("ibv_reg_mr / ibv_alloc_pd");
  ibv_qp* qp = CreateQp(d.pd, d.cq);
  SendFd(sock, d.ctx->cmd_fd);
  Put(sock, Handles{d.pd->handle, mr->handle, other->handle, mr->lkey, mr->rkey, mr->length, qp->qp_num});
  bool ok = true;
  if (refused) {
    Report("refused", GetText(sock), &ok);
    int status = 0;
    waitpid(importer, &status, 0);
    return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
  }
  const uint32_t peer = Get<uint32_t>(sock);
  checks::ConnectRc(d, qp, peer, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  Put(sock, uint64_t(reinterpret_cast<uintptr_t>(buffer.data())));
  Report("imported_handles", GetText(sock), &ok);

  // receive_into
  for (size_t j = 0; j < kReceiveBytes; ++j) mine[j] = Pattern(1, j);
  if (Post(qp, IBV_WR_SEND, uintptr_t(mine.data()), kReceiveBytes, own->lkey)) Die("ibv_post_send");
  Put(sock, 'g');
  std::string problem = Expect(d.cq, IBV_WC_SUCCESS);
  problem += GetText(sock);
  if (problem.empty() && std::memcmp(buffer.data() + kReceiveAt, mine.data(), kReceiveBytes) != 0)
    problem = "the SEND's bytes are not in the exporter's buffer";
  Report("receive_into", problem, &ok);

  // send_from
  for (size_t j = 0; j < kSendBytes; ++j) buffer[kSendFrom + j] = Pattern(2, j);
  std::fill(mine.begin(), mine.end(), 0);
  if (PostReceive(qp, uintptr_t(mine.data()), kSendBytes, own->lkey)) Die("ibv_post_recv");
  Put(sock, 'g');
  problem = GetText(sock);
  problem += Expect(d.cq, IBV_WC_SUCCESS);
  if (problem.empty() && std::memcmp(mine.data(), buffer.data() + kSendFrom, kSendBytes) != 0)
    problem = "the received bytes are not the exporter's buffer's";
  Report("send_from", problem, &ok);

  // write_and_read: through the importer's QP, at our own R_Key.
  for (size_t j = 0; j < kWriteBytes; ++j) mine[j] = Pattern(3, j);
  if (Post(qp, IBV_WR_RDMA_WRITE, uintptr_t(mine.data()), kWriteBytes, own->lkey,
           uintptr_t(buffer.data()) + kWriteAt, mr->rkey))
    Die("ibv_post_send WRITE");
  problem = Expect(d.cq, IBV_WC_SUCCESS);
  if (problem.empty() && std::memcmp(buffer.data() + kWriteAt, mine.data(), kWriteBytes) != 0)
    problem = "the WRITE's bytes are not in the exporter's buffer";
  if (problem.empty()) {
    for (size_t j = 0; j < kWriteBytes; ++j) buffer[kWriteAt + j] = Pattern(4, j);
    std::fill(mine.begin(), mine.end(), 0);
    if (Post(qp, IBV_WR_RDMA_READ, uintptr_t(mine.data()), kWriteBytes, own->lkey,
             uintptr_t(buffer.data()) + kWriteAt, mr->rkey))
      Die("ibv_post_send READ");
    problem = Expect(d.cq, IBV_WC_SUCCESS);
    if (problem.empty() && std::memcmp(mine.data(), buffer.data() + kWriteAt, kWriteBytes) != 0)
      problem = "the READ did not bring the exporter's buffer's bytes";
  }
  Report("write_and_read", problem, &ok);

  // after_dereg
  if (ibv_dereg_mr(mr)) Die("ibv_dereg_mr");
  Put(sock, 'g');
  Report("after_dereg", GetText(sock), &ok);

  // exporter_killed
  const int second_fd = ReceiveFd(ev[0]);
  Handles h2 = Get<Handles>(ev[0]);
  const uint64_t base2 = Get<uint64_t>(ev[0]);
  ibv_qp* qp2 = CreateQp(d.pd, d.cq);
  h2.qpn = qp2->qp_num;
  SendFd(sock, second_fd);
  Put(sock, h2);
  Put(sock, base2);
  checks::ConnectRc(d, qp2, Get<uint32_t>(sock), 0);
  std::fill(mine.begin(), mine.end(), 0);
  if (PostReceive(qp2, uintptr_t(mine.data()), kSendBytes, own->lkey)) Die("ibv_post_recv");
  Put(sock, 'g');
  problem = GetText(sock);
  problem += Expect(d.cq, IBV_WC_SUCCESS);
  for (size_t j = 0; problem.empty() && j < kSendBytes; ++j)
    if (mine[j] != Pattern(5, j)) problem = "the bytes sent from the second exporter's region are not its";
  kill(second, SIGKILL);
  waitpid(second, nullptr, 0);
  if (PostReceive(qp2, uintptr_t(mine.data()), kSendBytes, own->lkey)) Die("ibv_post_recv");
  Put(sock, 'g');
  problem += GetText(sock);
  Report("exporter_killed", problem, &ok);

  int status = 0;
  if (waitpid(importer, &status, 0) != importer || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    printf("import_share_check: importer ended badly (status %d)\n", status);
    ok = false;
  }
  return ok ? 0 : 1;
}
