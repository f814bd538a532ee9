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
//
// `xrc_share_check open` shows ibv_open_qp(3) across processes instead: a creator makes two target QPs (connected to
// an initiator's two XRC_SEND QPs) and an XRC SRQ in the domain; an opener opens the domain by the same file, makes an
// SRQ and opens both target QPs by number (and a third, of a creator the check kills). Cases:
//   opened_handle     the opener's handle reports the QP's state, peer and path MTU (ibv_query_qp); a number without
//                     such a QP or a domain of another file is EINVAL
//   both_srqs         the initiator's messages through the one target QP land in both processes' SRQs alternately;
//                     the QP's IBV_EVENT_COMM_EST (its first packet in RTR, in the creator's process) reaches the
//                     opener's handle too; modified through that handle (RTR -> RTS, min_rnr_timer) the QP changes in
//                     the creator's process and the handle reports it; a transition the creator's would refuse is
//                     EINVAL
//   creator_let_go    the creator destroys its handles and SRQ and closes its domain (each returns 0); the QP goes on
//                     receiving into the opener's SRQ
//   last_handle       the opener destroys its handle of that QP: the QP is gone (the initiator's next message ends
//                     with IBV_WC_RETRY_EXC_ERR, opening it again is EINVAL)
//   creator_exit      the creator's process exits (without closing anything) while the opener and a second opener
//                     hold the second target QP, connected to the initiator's second QP: the QP lives on, now in one
//                     of their processes (from the state its creator last published): the initiator's messages through
//                     it arrive in both openers' SRQs alternately, their handles report IBV_QPS_RTR, no fatal event
//   creator_killed    a second creator, killed (-9) while the opener holds its target QP (connected to the
//                     initiator's third QP): the QP lives on in the opener's process, from the state its creator
//                     last published: the initiator's messages through it arrive, RTR, no fatal event
// `xrc_share_check open NETNS ADDR` puts the initiator on another host: it enters network namespace NETNS (a file of
// /run/netns) and opens the host device of ADDR there.
// Exit status 0 when every case passed.
#include <infiniband/verbs.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
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

// The port's active MTU: the path MTU of our connections (1024 on a 1500-byte veth, 4096 on loopback).
ibv_mtu ActiveMtu(Device& d) {
  ibv_port_attr p{};
  if (ibv_query_port(d.ctx, 1, &p)) Die("ibv_query_port");
  return p.active_mtu;
}

// RESET -> INIT -> RTR (-> RTS for an initiator) towards `peer_qpn` at `peer_gid` (default: our own GID, one host
// device).
void Connect(Device& d, ibv_qp* qp, uint32_t peer_qpn, bool initiator, const ibv_gid* peer_gid = nullptr) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = initiator ? 0 : IBV_ACCESS_REMOTE_WRITE;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  if ((errno = ibv_modify_qp(qp, &a, mask))) Die("to INIT");
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = ActiveMtu(d);
  a.dest_qp_num = peer_qpn;
  a.rq_psn = 0;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = peer_gid != nullptr ? *peer_gid : d.gid;
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

// What is wrong with completion `i` of a receive into SRQ `r`, whose buffer holds `bytes`, of message m of initiator
// k < `initiators`, sent through target QP targets[k] (empty: nothing).
std::string Unexpected(int i, const ibv_wc& wc, const uint8_t* bytes, int r, const uint32_t* targets, int initiators) {
  const int k = bytes[0], m = bytes[1], s = bytes[2];
  char what[160];
  snprintf(what, sizeof what, "completion %d (wr_id %llu, %s, qp_num 0x%x, %u bytes, from %d/%d for SRQ %d): ", i,
           (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.qp_num, wc.byte_len, k, m, s);
  if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) return std::string(what) + "failed; ";
  if (wc.byte_len < 4 || k >= initiators || s != r || m >= kMessages || bytes[3] != 0xC5)
    return std::string(what) + "not meant for this SRQ; ";
  std::string problem;
  if (wc.qp_num != targets[k]) problem += std::string(what) + "qp_num is not its target QP's; ";
  if (wc.byte_len != kSizes[m % std::size(kSizes)]) problem += std::string(what) + "wrong length; ";
  for (size_t j = 0; j < wc.byte_len; ++j) {
    if (bytes[j] != Pattern(k, m, s, j)) return problem + what + "byte " + std::to_string(j) + " differs; ";
  }
  return problem;
}

// An initiator's XRC_SEND QP, on the device's CQ.
ibv_qp* CreateXrcSend(Device& d) {
  ibv_qp_init_attr_ex a{};
  a.qp_type = IBV_QPT_XRC_SEND;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = d.pd;
  a.send_cq = d.cq;
  a.recv_cq = d.cq;
  a.cap.max_send_wr = kMessages + 4;
  a.cap.max_send_sge = 1;
  ibv_qp* qp = ibv_create_qp_ex(d.ctx, &a);
  if (qp == nullptr) Die("ibv_create_qp_ex (XRC_SEND)");
  return qp;
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
  for (int i = 0; i < got; ++i) problem += Unexpected(i, wcs[i], buffer.data() + wcs[i].wr_id * kSlot, r, targets, 2);
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
  ibv_qp* qp = CreateXrcSend(d);
  ibv_qp* qp2 = CreateXrcSend(d);
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

// Forks `n` children; child c runs body(c, its end of a socket pair to us) and exits with what it returns (exit, not
// _exit: the device's --stats counters print at its end). Our ends in fds[c], their pids in pids[c].
void ForkChildren(int n, int* fds, pid_t* pids, const std::function<int(int, int)>& body) {
  for (int c = 0; c < n; ++c) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0) Die("socketpair");
    pids[c] = fork();
    if (pids[c] < 0) Die("fork");
    if (pids[c] == 0) {
      close(pair[0]);
      exit(body(c, pair[1]));
    }
    close(pair[1]);
    fds[c] = pair[0];
  }
}

// Tells the children `which` to end and waits for them: how many did not exit with 0 (each said).
int EndChildren(std::initializer_list<int> which, const int* fds, const pid_t* pids) {
  for (int c : which) Put(fds[c], 'e');
  int failed = 0;
  for (int c : which) {
    int st = 0;
    waitpid(pids[c], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      printf("xrc_share_check: process %d ended with status 0x%x\n", c, st);
      ++failed;
    }
  }
  return failed;
}

// Whether `fd` has something to read within `ms`.
bool Readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

// --- ibv_open_qp across processes (`xrc_share_check open`) --------------------------------------------------------

void PutProblem(int fd, const std::string& problem) {
  Put(fd, problem.size());
  SendAll(fd, problem.data(), problem.size());
}

constexpr int kBoth = 8;   // both_srqs' messages, alternately into the creator's SRQ (0) and the opener's (1)
constexpr int kAfter = 4;  // creator_let_go's and creator_exit's, into the opener's

// What the creator tells the parent.
struct CreatorInfo {
  uint32_t target;   // connected to the initiator's first QP
  uint32_t lasting;  // to its second: creator_exit's
  uint32_t srqn;
  ibv_gid gid;
};
// What the initiator tells the parent, and what it is told.
struct InitiatorInfo {
  uint32_t qpn[3];
  ibv_gid gid;
};
struct OpenPlan {
  uint32_t target[3];
  uint32_t srqn[3];  // the creator's, the opener's and the second opener's SRQ
  ibv_gid gid;       // the creator's
};

// A device's XRC SRQ in domain `x` with `n` receives of kSlot posted into `buffer` (registered in `*mr`).
ibv_srq* SrqWithReceives(Device& d, ibv_xrcd* x, std::vector<uint8_t>& buffer, ibv_mr** mr, int n) {
  ibv_srq* srq = CreateXrcSrq(d, x);
  *mr = ibv_reg_mr(d.pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE);
  if (*mr == nullptr) Die("ibv_reg_mr");
  for (int i = 0; i < n; ++i) {
    ibv_sge sge{uintptr_t(buffer.data() + i * kSlot), uint32_t(kSlot), (*mr)->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_srq_recv(srq, &wr, &bad)) Die("ibv_post_srq_recv");
  }
  return srq;
}

// `n` messages of the initiator (number 0) for SRQ `s`, through target QP `target`, checked.
std::string ReceiveChecked(Device& d, const std::vector<uint8_t>& buffer, int n, int s, uint32_t target) {
  std::vector<ibv_wc> wcs(n);
  const int got = PollFor(d.cq, wcs.data(), n);
  std::string problem;
  if (got != n) problem += std::to_string(got) + " of " + std::to_string(n) + " messages; ";
  for (int i = 0; i < got; ++i) problem += Unexpected(i, wcs[i], buffer.data() + wcs[i].wr_id * kSlot, s, &target, 1);
  return problem;
}

ibv_qp* CreateTarget(Device& d, ibv_xrcd* x) {
  ibv_qp_init_attr_ex t{};
  t.qp_type = IBV_QPT_XRC_RECV;
  t.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  t.xrcd = x;
  ibv_qp* qp = ibv_create_qp_ex(d.ctx, &t);
  if (qp == nullptr) Die("ibv_create_qp_ex (XRC target)");
  return qp;
}

// ibv_open_qp of `qpn` in domain `x`: the handle, or null with errno set.
ibv_qp* OpenTarget(Device& d, uint32_t qpn, ibv_xrcd* x) {
  ibv_qp_open_attr oa{};
  oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  oa.qp_num = qpn;
  oa.xrcd = x;
  oa.qp_type = IBV_QPT_XRC_RECV;
  return ibv_open_qp(d.ctx, &oa);
}

// The state `qp` reports (-1: the query failed).
int StateOf(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  return ibv_query_qp(qp, &a, IBV_QP_STATE, &init) == 0 ? int(a.qp_state) : -1;
}

// Whether an event `type` for `qp` comes within `ms` (other events are taken and acknowledged).
bool EventFor(Device& d, ibv_qp* qp, ibv_event_type type, int ms) {
  const int flags = fcntl(d.ctx->async_fd, F_GETFL);
  fcntl(d.ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  pollfd p{d.ctx->async_fd, POLLIN, 0};
  do {
    ibv_async_event e{};
    if (ibv_get_async_event(d.ctx, &e) != 0) continue;
    const bool found = e.event_type == type && e.element.qp == qp;
    ibv_ack_async_event(&e);
    if (found) return true;
  } while (std::chrono::steady_clock::now() < until && poll(&p, 1, 50) >= 0);
  return false;
}

// A target QP whose creator is gone, run on by a holder (here or elsewhere): `n` messages through it into SRQ `s`
// arrive, checked; `handle` reports RTR and got no fatal event; it is destroyed.
std::string RunsOn(Device& d, const std::vector<uint8_t>& buffer, int n, int s, ibv_qp* handle) {
  std::string problem = ReceiveChecked(d, buffer, n, s, handle->qp_num);
  if (const int state = StateOf(handle); state != IBV_QPS_RTR)
    problem += "its state is " + std::to_string(state) + ", want IBV_QPS_RTR; ";
  if (EventFor(d, handle, IBV_EVENT_QP_FATAL, 0)) problem += "IBV_EVENT_QP_FATAL for it; ";
  if (int rc = ibv_destroy_qp(handle)) problem += "ibv_destroy_qp: " + std::string(strerror(rc)) + "; ";
  return problem;
}

int Creator(int fd, const char* file) {
  Device d = Open();
  ibv_xrcd* x = OpenDomain(d, file);
  std::vector<uint8_t> buffer(kSlot * kSlots, 0);
  ibv_mr* mr = nullptr;
  ibv_srq* srq = SrqWithReceives(d, x, buffer, &mr, kBoth / 2);
  ibv_qp* target = CreateTarget(d, x);
  ibv_qp* lasting = CreateTarget(d, x);
  uint32_t srqn = 0;
  if (ibv_get_srq_num(srq, &srqn)) Die("ibv_get_srq_num");
  Put(fd, CreatorInfo{target->qp_num, lasting->qp_num, srqn, d.gid});
  const InitiatorInfo initiator = Get<InitiatorInfo>(fd);
  Connect(d, target, initiator.qpn[0], /*initiator=*/false, &initiator.gid);
  Connect(d, lasting, initiator.qpn[1], /*initiator=*/false, &initiator.gid);
  Put(fd, 'r');
  PutProblem(fd, ReceiveChecked(d, buffer, kBoth / 2, 0, target->qp_num));  // both_srqs
  Get<char>(fd);  // creator_let_go: every handle and object of the domain goes
  std::string problem;
  const uint32_t target_qpn = target->qp_num;
  if (int rc = ibv_destroy_qp(target)) problem += "ibv_destroy_qp: " + std::string(strerror(rc)) + "; ";
  if (int rc = ibv_destroy_qp(lasting)) problem += "ibv_destroy_qp (second): " + std::string(strerror(rc)) + "; ";
  if (int rc = ibv_destroy_srq(srq)) problem += "ibv_destroy_srq: " + std::string(strerror(rc)) + "; ";
  if (int rc = ibv_close_xrcd(x)) problem += "ibv_close_xrcd: " + std::string(strerror(rc)) + "; ";
  // Another open of the file finds the QP again, ours to hold.
  x = OpenDomain(d, file);
  ibv_qp* again = OpenTarget(d, target_qpn, x);
  if (again == nullptr)
    problem += "ibv_open_qp of our own target QP after letting go: " + std::string(strerror(errno)) + "; ";
  if (again != nullptr && ibv_destroy_qp(again)) problem += "ibv_destroy_qp of it again failed; ";
  if (ibv_close_xrcd(x)) problem += "ibv_close_xrcd again failed; ";
  PutProblem(fd, problem);
  Get<char>(fd);  // creator_exit: now, without closing anything
  return 0;
}

// A creator killed (creator_killed) while the opener holds its target QP, connected to the initiator's third QP.
int KilledCreator(int fd, const char* file) {
  Device d = Open();
  ibv_xrcd* x = OpenDomain(d, file);
  ibv_qp* target = CreateTarget(d, x);
  Put(fd, target->qp_num);
  const InitiatorInfo initiator = Get<InitiatorInfo>(fd);
  Connect(d, target, initiator.qpn[2], /*initiator=*/false, &initiator.gid);
  Put(fd, 'r');
  Get<char>(fd);  // never comes: SIGKILL does
  return 0;
}

int Opener(int fd, const char* file, const char* other_file) {
  Device d = Open();
  ibv_xrcd* x = OpenDomain(d, file);
  ibv_xrcd* other = OpenDomain(d, other_file);
  std::vector<uint8_t> buffer(kSlot * kSlots, 0);
  ibv_mr* mr = nullptr;
  ibv_srq* srq = SrqWithReceives(d, x, buffer, &mr, kBoth / 2 + kAfter + kAfter / 2 + kAfter);
  uint32_t srqn = 0;
  if (ibv_get_srq_num(srq, &srqn)) Die("ibv_get_srq_num");
  Put(fd, srqn);
  const CreatorInfo c = Get<CreatorInfo>(fd);
  const InitiatorInfo initiator = Get<InitiatorInfo>(fd);
  const uint32_t killed_qpn = Get<uint32_t>(fd);

  // opened_handle
  std::string problem;
  ibv_qp* target = OpenTarget(d, c.target, x);
  ibv_qp* lasting = OpenTarget(d, c.lasting, x);
  ibv_qp* killed = OpenTarget(d, killed_qpn, x);
  if (target == nullptr || lasting == nullptr || killed == nullptr) Die("ibv_open_qp of the creators' target QPs");
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  if (int rc = ibv_query_qp(target, &a, IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_PATH_MTU, &init)) {
    problem += "ibv_query_qp: " + std::string(strerror(rc)) + "; ";
  } else if (a.qp_state != IBV_QPS_RTR || a.dest_qp_num != initiator.qpn[0] || a.path_mtu != ActiveMtu(d)) {
    problem += "ibv_query_qp: state " + std::to_string(a.qp_state) + " dest_qp_num " + std::to_string(a.dest_qp_num) +
               " path_mtu " + std::to_string(a.path_mtu) + "; ";
  }
  if (target->qp_num != c.target || target->qp_type != IBV_QPT_XRC_RECV) problem += "the handle's qp_num or type; ";
  errno = 0;
  if (OpenTarget(d, c.target, other) != nullptr || errno != EINVAL) problem += "opened in a domain of another file; ";
  errno = 0;
  const uint32_t none = (c.lasting & 0xff0000) | ((c.lasting + 0x100) & 0xffff);
  if (OpenTarget(d, none, x) != nullptr || errno != EINVAL) problem += "opened a number without a QP; ";
  PutProblem(fd, problem);

  // both_srqs: the messages, and the QP's first packet in RTR, IBV_EVENT_COMM_EST, which the creator's process
  // raised, on this handle too (ibv_open_qp(3): every handle gets the QP's events).
  problem = ReceiveChecked(d, buffer, kBoth / 2, 1, c.target);
  if (!EventFor(d, target, IBV_EVENT_COMM_EST, 2000)) problem += "no IBV_EVENT_COMM_EST on the handle; ";
  // Modified through the handle (ibv_open_qp(3): any handle may; the creator's process carries it out): RTR -> RTS
  // (it goes on receiving), then what its ibv_modify_qp refuses is refused the same.
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.sq_psn = 0;
  a.min_rnr_timer = 3;
  if (int rc = ibv_modify_qp(target, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN | IBV_QP_MIN_RNR_TIMER)) {
    problem += "ibv_modify_qp to RTS through the handle: " + std::string(strerror(rc)) + "; ";
  } else if (ibv_query_qp(target, &a, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER, &init) || a.qp_state != IBV_QPS_RTS ||
             a.min_rnr_timer != 3) {
    problem += "after ibv_modify_qp through the handle it reports state " + std::to_string(a.qp_state) +
               ", min_rnr_timer " + std::to_string(a.min_rnr_timer) + "; ";
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  if (int rc = ibv_modify_qp(target, &a, IBV_QP_STATE); rc != EINVAL)
    problem += "RTS -> RTR through the handle: " + std::to_string(rc) + ", want EINVAL; ";
  PutProblem(fd, problem);
  PutProblem(fd, ReceiveChecked(d, buffer, kAfter, 1, c.target));     // creator_let_go

  // last_handle: the creator's timers destroy the QP once nobody holds it (within milliseconds).
  Get<char>(fd);
  problem.clear();
  if (int rc = ibv_destroy_qp(target)) problem += "ibv_destroy_qp: " + std::string(strerror(rc)) + "; ";
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    errno = 0;
    ibv_qp* again = OpenTarget(d, c.target, x);
    if (again == nullptr) {
      if (errno != EINVAL) problem += "opening it again: " + std::string(strerror(errno)) + ", want EINVAL; ";
      break;
    }
    ibv_destroy_qp(again);
    if (std::chrono::steady_clock::now() > give_up) {
      problem += "still there 5 s after its last handle went; ";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  PutProblem(fd, problem);

  // creator_exit: the second QP runs on, here or in the second opener's process; the initiator's messages through it
  // arrive (half of them in the second opener's SRQ).
  Get<char>(fd);
  problem = RunsOn(d, buffer, kAfter / 2, 1, lasting);
  PutProblem(fd, problem);

  // creator_killed: its QP runs here now, from the state it published last.
  Get<char>(fd);
  problem = RunsOn(d, buffer, kAfter, 1, killed);
  PutProblem(fd, problem);
  Get<char>(fd);  // the end
  return 0;
}

// A second opener of the creator's second target QP (creator_exit): when the creator exits, it or the first opener
// runs the QP on, and the initiator's messages through it reach both their SRQs.
int SecondOpener(int fd, const char* file) {
  Device d = Open();
  ibv_xrcd* x = OpenDomain(d, file);
  std::vector<uint8_t> buffer(kSlot * kSlots, 0);
  ibv_mr* mr = nullptr;
  ibv_srq* srq = SrqWithReceives(d, x, buffer, &mr, kAfter / 2);
  uint32_t srqn = 0;
  if (ibv_get_srq_num(srq, &srqn)) Die("ibv_get_srq_num");
  Put(fd, srqn);
  const uint32_t lasting_qpn = Get<uint32_t>(fd);
  ibv_qp* lasting = OpenTarget(d, lasting_qpn, x);
  if (lasting == nullptr) Die("ibv_open_qp of the creator's second target QP");
  Put(fd, 'r');
  Get<char>(fd);  // creator_exit
  const std::string problem = RunsOn(d, buffer, kAfter / 2, 2, lasting);
  PutProblem(fd, problem);
  Get<char>(fd);  // the end
  return 0;
}

// `netns` (a file of /run/netns) and `addr`: the initiator is on another host, that network namespace, on its host
// device of that address; null: on ours.
int OpeningInitiator(int fd, const char* netns, const char* addr) {
  if (netns != nullptr) {
    const int ns = open(netns, O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) Die("setns into the other host's network namespace");
    close(ns);
    setenv("UROCE_ADDR", addr, 1);  // read when the device is first opened
  }
  Device d = Open();
  ibv_qp* qps[3] = {CreateXrcSend(d), CreateXrcSend(d), CreateXrcSend(d)};
  std::vector<uint8_t> local(kSlot * kMessages, 0);
  ibv_mr* mr = ibv_reg_mr(d.pd, local.data(), local.size(), IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) Die("ibv_reg_mr");
  Put(fd, InitiatorInfo{{qps[0]->qp_num, qps[1]->qp_num, qps[2]->qp_num}, d.gid});
  const OpenPlan plan = Get<OpenPlan>(fd);
  for (int q = 0; q < 3; ++q) Connect(d, qps[q], plan.target[q], /*initiator=*/true, &plan.gid);
  int m = 0;
  // `n` messages through QP `q`, into SRQ s(i) for the i-th: the statuses of their completions (`report`: as a
  // problem; else the first's status is put).
  auto send = [&](int n, int q, auto srq_of, bool report) {
    for (int i = 0; i < n; ++i, ++m) {
      const int s = srq_of(i);
      const uint32_t length = kSizes[m % std::size(kSizes)];
      uint8_t* at = local.data() + m * kSlot;
      for (size_t j = 0; j < length; ++j) at[j] = Pattern(0, m, s, j);
      ibv_sge sge{uintptr_t(at), length, mr->lkey};
      ibv_send_wr wr{}, *bad = nullptr;
      wr.wr_id = m;
      wr.opcode = IBV_WR_SEND;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.qp_type.xrc.remote_srqn = plan.srqn[s];
      if (ibv_post_send(qps[q], &wr, &bad)) Die("ibv_post_send");
    }
    std::vector<ibv_wc> wcs(n);
    const int got = PollFor(d.cq, wcs.data(), n);
    if (!report) return Put(fd, got == n ? int(wcs[0].status) : -1);
    std::string problem;
    if (got != n) problem += std::to_string(got) + " of " + std::to_string(n) + " completions; ";
    for (int i = 0; i < got; ++i) {
      if (wcs[i].status != IBV_WC_SUCCESS) problem += std::string("send ") + ibv_wc_status_str(wcs[i].status) + "; ";
    }
    PutProblem(fd, problem);
  };
  Get<char>(fd);
  send(kBoth, 0, [](int i) { return i % 2; }, true);  // both_srqs
  Get<char>(fd);
  send(kAfter, 0, [](int) { return 1; }, true);  // creator_let_go
  Get<char>(fd);
  send(1, 0, [](int) { return 1; }, false);  // last_handle: the QP is gone
  Get<char>(fd);
  send(kAfter, 1, [](int i) { return 1 + i % 2; }, true);  // creator_exit: through the second QP, run on elsewhere
  Get<char>(fd);
  send(kAfter, 2, [](int) { return 1; }, true);  // creator_killed: through the third, run by the opener now
  Get<char>(fd);  // the end
  return 0;
}

// The opened target QPs' cases (the file comment): 0 when all passed.
int OpenedTargets(const std::string (&files)[2], const char* netns, const char* addr) {
  // Child 0 creates, 1 opens, 2 initiates, 3 creates and is killed, 4 opens the second target QP too.
  constexpr int kChildren = 5;
  int fds[kChildren];
  pid_t pids[kChildren];
  const char* file = files[0].c_str();
  ForkChildren(kChildren, fds, pids, [&](int c, int fd) {
    return c == 0   ? Creator(fd, file)
           : c == 1 ? Opener(fd, file, files[1].c_str())
           : c == 2 ? OpeningInitiator(fd, netns, addr)
           : c == 3 ? KilledCreator(fd, file)
                    : SecondOpener(fd, file);
  });
  const int creator = fds[0], opener = fds[1], initiator = fds[2], second = fds[4];
  const CreatorInfo created = Get<CreatorInfo>(creator);
  const uint32_t opener_srqn = Get<uint32_t>(opener);
  const InitiatorInfo sender = Get<InitiatorInfo>(initiator);
  const uint32_t killed_qpn = Get<uint32_t>(fds[3]);
  const uint32_t second_srqn = Get<uint32_t>(second);
  Put(creator, sender);
  Get<char>(creator);  // its target QPs are connected
  Put(fds[3], sender);
  Get<char>(fds[3]);
  int failed = 0;
  Put(opener, created);
  Put(opener, sender);
  Put(opener, killed_qpn);
  failed += !Report("opened_handle", GetProblem(opener));
  Put(second, created.lasting);
  Get<char>(second);  // it holds it too

  Put(initiator,
      OpenPlan{{created.target, created.lasting, killed_qpn}, {created.srqn, opener_srqn, second_srqn}, created.gid});
  Put(initiator, 'g');
  std::string both;
  const char* who[3] = {"creator: ", "opener: ", "initiator: "};
  for (int c = 0; c < 3; ++c)
    if (std::string p = GetProblem(fds[c]); !p.empty()) both += who[c] + p;
  failed += !Report("both_srqs", both);

  Put(creator, 'g');
  std::string let_go = GetProblem(creator);
  if (!let_go.empty()) let_go = who[0] + let_go;
  Put(initiator, 'g');
  for (int c = 2; c >= 1; --c)
    if (std::string p = GetProblem(fds[c]); !p.empty()) let_go += who[c] + p;
  failed += !Report("creator_let_go", let_go);

  Put(opener, 'g');
  std::string last = GetProblem(opener);
  Put(initiator, 'g');
  if (const int status = Get<int>(initiator); status != IBV_WC_RETRY_EXC_ERR)
    last += "the initiator's next message: status " + std::to_string(status) + ", want IBV_WC_RETRY_EXC_ERR; ";
  failed += !Report("last_handle", last);

  Put(creator, 'x');
  int st = 0;
  waitpid(pids[0], &st, 0);
  std::string exited;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) exited += "the creator ended with status " + std::to_string(st) + "; ";
  Put(opener, 'g');
  Put(second, 'g');
  Put(initiator, 'g');
  if (std::string p = GetProblem(initiator); !p.empty()) exited += who[2] + p;
  if (std::string p = GetProblem(opener); !p.empty()) exited += who[1] + p;
  if (std::string p = GetProblem(second); !p.empty()) exited += "second opener: " + p;
  failed += !Report("creator_exit", exited);

  kill(pids[3], SIGKILL);
  waitpid(pids[3], &st, 0);
  Put(opener, 'g');
  Put(initiator, 'g');
  std::string killed;
  if (std::string p = GetProblem(initiator); !p.empty()) killed += who[2] + p;
  if (std::string p = GetProblem(opener); !p.empty()) killed += who[1] + p;
  failed += !Report("creator_killed", killed);
  failed += EndChildren({1, 2, 4}, fds, pids);
  printf("xrc_share_check: %d of 6 cases failed\n", failed);
  return failed == 0 ? 0 : 1;
}

// The shared SRQs' cases (the file comment): 0 when all passed.
int SharedSrqs(const std::string (&files)[2]) {
  // Children 0 and 1 receive, 2 and 3 initiate.
  int fds[4];
  pid_t pids[4];
  ForkChildren(4, fds, pids, [&](int c, int fd) {
    return c < 2 ? Receiver(c, fd, files[0].c_str(), files[1].c_str()) : Initiator(c - 2, fd);
  });
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
  failed += EndChildren({0, 1, 2, 3}, fds, pids);
  printf("xrc_share_check: %d of 5 cases failed\n", failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  uroce::checks::program = "xrc_share_check";
  const char* tmp = getenv("TEST_TMPDIR") != nullptr ? getenv("TEST_TMPDIR") : "/tmp";
  std::string files[2] = {std::string(tmp) + "/xrc_share_check.XXXXXX", std::string(tmp) + "/xrc_share_other.XXXXXX"};
  for (std::string& f : files) {
    const int fd = mkstemp(f.data());
    if (fd < 0) Die("mkstemp");
    close(fd);
  }
  // open [NETNS ADDR]: the initiator on another host (the file comment).
  const bool open = argc > 1 && strcmp(argv[1], "open") == 0;
  const char* netns = open && argc > 3 ? argv[2] : nullptr;
  const char* addr = open && argc > 3 ? argv[3] : nullptr;
  const int rc = open ? OpenedTargets(files, netns, addr) : SharedSrqs(files);
  for (const std::string& f : files) unlink(f.c_str());
  return rc;
}
