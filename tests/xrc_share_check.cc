// xrc_share_check: XRC between processes of the host device (ibv_open_xrcd(3): processes share an XRC domain by
// opening it by one file; Annex A14: a target QP delivers into any XRC SRQ of its domain). Run it under
// `uroce run --host-device`.
//
// The parent forks two receivers and two initiators, each opening the device after the fork, and passes what they
// must know between them. Each receiver opens the domain by the same file and creates an XRC SRQ in it and two target
// QPs; initiator k's two XRC_SEND QPs are connected to receiver k's. Cases, each one line:
//   crossed_delivery  each initiator sends messages of 4 B to 16 KiB alternately into both SRQs through its one target
//                     QP, so half of them cross from one process's target QP into the other process's SRQ: every
//                     message lands in the SRQ it named (each carries where it was meant to go), bytes intact,
//                     completed in that SRQ's CQ with the number of the target QP it came through
//   not_ready         a SEND into the other process's SRQ when it has no receive left is not completed until that
//                     process posts one (the target answers RNR NAKs meanwhile), then arrives
//   other_domain      a SEND naming an SRQ the other process made in another domain: IBV_WC_REM_INV_REQ_ERR
//   write_refused     an RDMA WRITE through a target QP naming the other process's SRQ: IBV_WC_REM_ACCESS_ERR
//   too_long          a SEND through a target QP into the other process's SRQ, longer than the receive it takes:
//                     IBV_WC_REM_INV_REQ_ERR for the sender, IBV_WC_LOC_LEN_ERR for that receive
// Exit status 0 when every case passed.
#include <infiniband/verbs.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/verbs_process.h"

namespace {

namespace checks = uroce::checks;

constexpr int kMessages = 24;  // per initiator in crossed_delivery, half into each SRQ
constexpr uint32_t kSizes[] = {4, 100, 4096, 5000, 16384, 12345};
constexpr size_t kSlot = 16384;  // each receive WQE's buffer
constexpr int kSlots = kMessages + 4;

using checks::Die;
using checks::Get;
using checks::Put;
using checks::ReceiveAll;
using checks::SendAll;

// Byte j of message m of initiator k meant for SRQ s (0: receiver 0's, 1: receiver 1's). The first four bytes (when
// the message has them) say k, m and s, so a receiver can tell what reached it and whether it was meant for it.
uint8_t Pattern(int k, int m, int s, size_t j) {
  if (j == 0) return uint8_t(k);
  if (j == 1) return uint8_t(m);
  if (j == 2) return uint8_t(s);
  if (j == 3) return 0xC5;
  return uint8_t(k * 31 + m * 7 + s * 101 + j * 13);
}

using checks::Device;

Device Open() { return checks::OpenFirstDevice(256); }

// RESET -> INIT -> RTR (-> RTS for an initiator) towards `peer_qpn` at our own GID (one host device).
void Connect(Device& d, ibv_qp* qp, uint32_t peer_qpn, bool initiator) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = initiator ? 0 : IBV_ACCESS_REMOTE_WRITE;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  if ((errno = ibv_modify_qp(qp, &a, mask))) Die("to INIT");
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = peer_qpn;
  a.rq_psn = 0;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = d.gid;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (!initiator) {
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;  // 0.01 ms: not_ready's retries come quickly
    mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  }
  if ((errno = ibv_modify_qp(qp, &a, mask))) Die("to RTR");
  if (!initiator) return;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;  // for ever: not_ready decides when the receive comes
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  if ((errno = ibv_modify_qp(qp, &a,
                             IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                 IBV_QP_MAX_QP_RD_ATOMIC)))
    Die("to RTS");
}

// Waits up to 20 s for `want` completions.
int PollFor(ibv_cq* cq, ibv_wc* wcs, int want) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int got = 0;
  while (got < want && std::chrono::steady_clock::now() < give_up) {
    const int n = ibv_poll_cq(cq, want - got, wcs + got);
    if (n < 0) Die("ibv_poll_cq");
    got += n;
  }
  return got;
}

ibv_xrcd* OpenDomain(Device& d, const char* path) {
  const int fd = open(path, O_RDONLY);
  if (fd < 0) Die("open the domain's file");
  ibv_xrcd_init_attr a{};
  a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  a.fd = fd;
  a.oflags = O_CREAT;
  ibv_xrcd* x = ibv_open_xrcd(d.ctx, &a);
  if (x == nullptr) Die("ibv_open_xrcd");
  close(fd);  // the domain stays with its file's inode
  return x;
}

ibv_srq* CreateXrcSrq(Device& d, ibv_xrcd* x) {
  ibv_srq_init_attr_ex a{};
  a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD;
  a.srq_type = IBV_SRQT_XRC;
  a.attr.max_wr = kSlots;
  a.attr.max_sge = 1;
  a.xrcd = x;
  a.cq = d.cq;
  a.pd = d.pd;
  ibv_srq* s = ibv_create_srq_ex(d.ctx, &a);
  if (s == nullptr) Die("ibv_create_srq_ex");
  return s;
}

// What a receiver tells the parent.
struct ReceiverInfo {
  uint32_t srqn;
  uint32_t target_qpn[2];
  uint32_t other_domain_srqn;
};
// What an initiator is told.
struct InitiatorPlan {
  uint32_t target_qpn[2];  // for its two QPs
  uint32_t srqn[2];
  uint32_t other_domain_srqn;
};

// Receiver r (0 or 1): its SRQ takes crossed_delivery's messages of both initiators; receiver 1 then not_ready's.
int Receiver(int r, int fd, const char* domain_file, const char* other_file) {
  Device d = Open();
  ibv_xrcd* x = OpenDomain(d, domain_file);
  ibv_srq* srq = CreateXrcSrq(d, x);
  ibv_srq* other = CreateXrcSrq(d, OpenDomain(d, other_file));
  ibv_qp_init_attr_ex t{};
  t.qp_type = IBV_QPT_XRC_RECV;
  t.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  t.xrcd = x;
  ibv_qp* target = ibv_create_qp_ex(d.ctx, &t);
  ibv_qp* spare = ibv_create_qp_ex(d.ctx, &t);
  if (target == nullptr || spare == nullptr) Die("ibv_create_qp_ex (XRC target)");
  std::vector<uint8_t> buffer(kSlot * kSlots, 0);
  ibv_mr* mr = ibv_reg_mr(d.pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (mr == nullptr) Die("ibv_reg_mr");
  uint32_t srqn = 0, other_srqn = 0;
  if (ibv_get_srq_num(srq, &srqn) || ibv_get_srq_num(other, &other_srqn)) Die("ibv_get_srq_num");
  Put(fd, ReceiverInfo{srqn, {target->qp_num, spare->qp_num}, other_srqn});
  Connect(d, target, Get<uint32_t>(fd), /*initiator=*/false);
  Connect(d, spare, Get<uint32_t>(fd), /*initiator=*/false);
  auto post = [&](int slot) {
    ibv_sge sge{uintptr_t(buffer.data() + slot * kSlot), uint32_t(kSlot), mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_srq_recv(srq, &wr, &bad)) Die("ibv_post_srq_recv");
  };
  for (int i = 0; i < kMessages; ++i) post(i);
  Put(fd, 'r');
  const uint32_t targets[2] = {Get<uint32_t>(fd), Get<uint32_t>(fd)};  // receiver 0's and 1's target QPs
  const uint32_t other_spare = Get<uint32_t>(fd);                       // the other receiver's second one

  // crossed_delivery: kMessages / 2 from each initiator.
  std::string problem;
  std::vector<ibv_wc> wcs(kMessages);
  const int got = PollFor(d.cq, wcs.data(), kMessages);
  if (got != kMessages) problem += std::to_string(got) + " of " + std::to_string(kMessages) + " messages; ";
  for (int i = 0; i < got; ++i) {
    const ibv_wc& wc = wcs[i];
    const uint8_t* bytes = buffer.data() + wc.wr_id * kSlot;
    const int k = bytes[0], m = bytes[1], s = bytes[2];
    char what[160];
    snprintf(what, sizeof what, "completion %d (wr_id %llu, %s, qp_num 0x%x, %u bytes, from %d/%d for SRQ %d): ", i,
             (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.qp_num, wc.byte_len, k, m, s);
    if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) {
      problem += std::string(what) + "failed; ";
      continue;
    }
    if (wc.byte_len < 4 || k > 1 || s != r || m >= kMessages || bytes[3] != 0xC5) {
      problem += std::string(what) + "not meant for this SRQ; ";
      continue;
    }
    if (wc.qp_num != targets[k]) problem += std::string(what) + "qp_num is not its target QP's; ";
    if (wc.byte_len != kSizes[m % std::size(kSizes)]) problem += std::string(what) + "wrong length; ";
    for (size_t j = 0; j < wc.byte_len; ++j) {
      if (bytes[j] != Pattern(k, m, s, j)) {
        problem += std::string(what) + "byte " + std::to_string(j) + " differs; ";
        break;
      }
    }
  }
  Put(fd, problem.size());
  SendAll(fd, problem.data(), problem.size());

  // too_long (receiver 0): a receive of 1000 bytes, which a longer SEND through the other receiver's second target
  // QP takes and fails.
  if (r == 0) {
    Get<char>(fd);
    ibv_sge sge{uintptr_t(buffer.data() + (kMessages + 1) * kSlot), 1000, mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = kMessages + 1;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_srq_recv(srq, &wr, &bad)) Die("ibv_post_srq_recv");
    Put(fd, 'r');
    ibv_wc wc{};
    const int n = PollFor(d.cq, &wc, 1);
    Put(fd, n == 1 && wc.status == IBV_WC_LOC_LEN_ERR && wc.wr_id == uint64_t(kMessages + 1) &&
                wc.qp_num == other_spare);
  }
  // not_ready (receiver 1): the message waits for the receive posted when the parent says.
  if (r == 1) {
    Get<char>(fd);
    post(kMessages);
    ibv_wc wc{};
    const int n = PollFor(d.cq, &wc, 1);
    const uint8_t* bytes = buffer.data() + kMessages * kSlot;
    const bool ok = n == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 300 && bytes[0] == 0 &&
                    bytes[1] == kMessages && bytes[2] == 1 && wc.qp_num == targets[0];
    Put(fd, ok);
  }
  Get<char>(fd);  // the end
  return 0;
}

// Initiator k: crossed_delivery; then not_ready (initiator 0) and other_domain (0) or write_refused (1).
int Initiator(int k, int fd) {
  Device d = Open();
  ibv_qp_init_attr_ex a{};
  a.qp_type = IBV_QPT_XRC_SEND;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = d.pd;
  a.send_cq = d.cq;
  a.recv_cq = d.cq;
  a.cap.max_send_wr = kMessages + 4;
  a.cap.max_send_sge = 1;
  ibv_qp* qp = ibv_create_qp_ex(d.ctx, &a);
  ibv_qp* qp2 = ibv_create_qp_ex(d.ctx, &a);
  if (qp == nullptr || qp2 == nullptr) Die("ibv_create_qp_ex (XRC_SEND)");
  std::vector<uint8_t> local(kSlot * (kMessages + 1), 0);
  ibv_mr* mr = ibv_reg_mr(d.pd, local.data(), local.size(), IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) Die("ibv_reg_mr");
  Put(fd, qp->qp_num);
  Put(fd, qp2->qp_num);
  const InitiatorPlan plan = Get<InitiatorPlan>(fd);
  Connect(d, qp, plan.target_qpn[0], /*initiator=*/true);
  Connect(d, qp2, plan.target_qpn[1], /*initiator=*/true);
  auto post = [&](int m, int s, uint32_t srqn, uint32_t length, ibv_wr_opcode op, ibv_qp* on) {
    uint8_t* at = local.data() + m * kSlot;
    for (size_t j = 0; j < length; ++j) at[j] = Pattern(k, m, s, j);
    ibv_sge sge{uintptr_t(at), length, mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = m;
    wr.opcode = op;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.qp_type.xrc.remote_srqn = srqn;
    if (op == IBV_WR_RDMA_WRITE) {
      wr.wr.rdma.remote_addr = 0x1000;  // refused before any address is looked at
      wr.wr.rdma.rkey = 1;
    }
    if (ibv_post_send(on, &wr, &bad)) Die("ibv_post_send");
  };
  Get<char>(fd);  // both receivers have posted their receives
  for (int m = 0; m < kMessages; ++m)
    post(m, m % 2, plan.srqn[m % 2], kSizes[m % std::size(kSizes)], IBV_WR_SEND, qp);
  std::string problem;
  std::vector<ibv_wc> wcs(kMessages);
  const int got = PollFor(d.cq, wcs.data(), kMessages);
  if (got != kMessages) problem += std::to_string(got) + " of " + std::to_string(kMessages) + " completions; ";
  for (int i = 0; i < got; ++i) {
    if (wcs[i].status != IBV_WC_SUCCESS) problem += std::string("send ") + ibv_wc_status_str(wcs[i].status) + "; ";
  }
  Put(fd, problem.size());
  SendAll(fd, problem.data(), problem.size());

  auto outcome = [&](int m, int s, uint32_t srqn, uint32_t length, ibv_wr_opcode op, ibv_qp* on) {
    post(m, s, srqn, length, op, on);
    ibv_wc wc{};
    Put(fd, PollFor(d.cq, &wc, 1) == 1 ? int(wc.status) : -1);
  };
  Get<char>(fd);
  if (k == 0) {
    outcome(kMessages, 1, plan.srqn[1], 300, IBV_WR_SEND, qp);  // not_ready
    Get<char>(fd);
    outcome(kMessages, 0, plan.other_domain_srqn, 10, IBV_WR_SEND, qp);  // other_domain
  } else {
    outcome(kMessages, 0, plan.srqn[0], 10, IBV_WR_RDMA_WRITE, qp);  // write_refused
    Get<char>(fd);
    outcome(kMessages, 0, plan.srqn[0], 5000, IBV_WR_SEND, qp2);  // too_long
  }
  Get<char>(fd);  // the end
  return 0;
}

bool Report(const char* name, const std::string& problem) {
  printf("xrc_share_check: %s: %s\n", name, problem.empty() ? "ok" : problem.c_str());
  return problem.empty();
}

std::string GetProblem(int fd) {
  std::string s(Get<size_t>(fd), '\0');
  if (!s.empty()) ReceiveAll(fd, s.data(), s.size());
  return s;
}

// Whether `fd` has something to read within `ms`.
bool Readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  uroce::checks::program = "xrc_share_check";
  const char* tmp = getenv("TEST_TMPDIR") != nullptr ? getenv("TEST_TMPDIR") : "/tmp";
  std::string files[2] = {std::string(tmp) + "/xrc_share_check.XXXXXX", std::string(tmp) + "/xrc_share_other.XXXXXX"};
  for (std::string& f : files) {
    const int fd = mkstemp(f.data());
    if (fd < 0) Die("mkstemp");
    close(fd);
  }
  // Children 0 and 1 receive, 2 and 3 initiate.
  int fds[4];
  pid_t pids[4];
  for (int c = 0; c < 4; ++c) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0) Die("socketpair");
    pids[c] = fork();
    if (pids[c] < 0) Die("fork");
    if (pids[c] == 0) {
      close(pair[0]);
      // exit, not _exit: the device's --stats counters print at its end.
      exit(c < 2 ? Receiver(c, pair[1], files[0].c_str(), files[1].c_str()) : Initiator(c - 2, pair[1]));
    }
    close(pair[1]);
    fds[c] = pair[0];
  }
  const ReceiverInfo rx[2] = {Get<ReceiverInfo>(fds[0]), Get<ReceiverInfo>(fds[1])};
  uint32_t ix[2][2];
  for (int k = 0; k < 2; ++k) ix[k][0] = Get<uint32_t>(fds[2 + k]), ix[k][1] = Get<uint32_t>(fds[2 + k]);
  for (int k = 0; k < 2; ++k) {
    Put(fds[k], ix[k][0]);
    Put(fds[k], ix[k][1]);
    Put(fds[2 + k], InitiatorPlan{{rx[k].target_qpn[0], rx[k].target_qpn[1]}, {rx[0].srqn, rx[1].srqn},
                                  rx[1].other_domain_srqn});
  }
  for (int k = 0; k < 2; ++k) Get<char>(fds[k]);
  for (int c = 0; c < 4; ++c) {
    if (c < 2) {
      Put(fds[c], rx[0].target_qpn[0]);
      Put(fds[c], rx[1].target_qpn[0]);
      Put(fds[c], rx[1 - c].target_qpn[1]);
    } else {
      Put(fds[c], 'g');
    }
  }
  int failed = 0;
  std::string crossed;
  for (int c = 0; c < 4; ++c) {
    const std::string p = GetProblem(fds[c]);
    if (!p.empty()) crossed += std::string(c < 2 ? "receiver " : "initiator ") + std::to_string(c % 2) + ": " + p;
  }
  failed += !Report("crossed_delivery", crossed);

  // not_ready: initiator 0's SEND into receiver 1's SRQ, which has no receive left.
  Put(fds[2], 'g');
  Put(fds[3], 'g');
  std::string not_ready;
  if (Readable(fds[2], 300)) not_ready += "completed before the receive was posted; ";
  Put(fds[1], 'p');
  const int status = Get<int>(fds[2]);
  if (status != IBV_WC_SUCCESS) not_ready += "initiator's completion status " + std::to_string(status) + "; ";
  if (!Get<bool>(fds[1])) not_ready += "the receiver did not get it as sent; ";
  failed += !Report("not_ready", not_ready);

  Put(fds[2], 'g');
  const int other = Get<int>(fds[2]);
  failed += !Report("other_domain", other == IBV_WC_REM_INV_REQ_ERR
                                        ? ""
                                        : "status " + std::to_string(other) + ", want IBV_WC_REM_INV_REQ_ERR");
  const int write = Get<int>(fds[3]);
  failed += !Report("write_refused", write == IBV_WC_REM_ACCESS_ERR
                                         ? ""
                                         : "status " + std::to_string(write) + ", want IBV_WC_REM_ACCESS_ERR");
  Put(fds[0], 'p');
  Get<char>(fds[0]);  // its receive is posted
  Put(fds[3], 'g');
  const int too_long = Get<int>(fds[3]);
  std::string too_long_problem;
  if (too_long != IBV_WC_REM_INV_REQ_ERR)
    too_long_problem += "sender's status " + std::to_string(too_long) + ", want IBV_WC_REM_INV_REQ_ERR; ";
  if (!Get<bool>(fds[0])) too_long_problem += "the receive did not complete with IBV_WC_LOC_LEN_ERR; ";
  failed += !Report("too_long", too_long_problem);
  for (int c = 0; c < 4; ++c) Put(fds[c], 'e');
  for (int c = 0; c < 4; ++c) {
    int st = 0;
    waitpid(pids[c], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      printf("xrc_share_check: process %d ended with status 0x%x\n", c, st);
      ++failed;
    }
  }
  for (const std::string& f : files) unlink(f.c_str());
  printf("xrc_share_check: %d of 5 cases failed\n", failed);
  return failed == 0 ? 0 : 1;
}
