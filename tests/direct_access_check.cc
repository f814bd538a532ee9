// direct_access_check: RDMA WRITE, READ and SEND between two processes of the host device, which the initiator carries out
// in the target's memory without a packet where the target's published table allows it (wire/direct_access.h). What
// the application sees must be exactly what the responder gives: the bytes where they belong, and for every access
// the responder would refuse, the same error completion (the table refuses it, the packets carry it, the responder
// NAKs it). Written against the plain verbs API like any client; run it under `uroce run --host-device`.
//
// One process forks: the child is the target, the parent the initiator; each opens the device after the fork. Each
// case connects a fresh RC QP pair (the same GID: one host device) and the target checks its own buffer afterwards:
//   write_then_read      a WRITE of three SGEs, a READ of it back into two: bytes in both processes' buffers
//   inline_write         a WRITE with IBV_SEND_INLINE
//   bad_rkey             a WRITE with an R_Key the target never had: IBV_WC_REM_ACCESS_ERR, buffer unchanged
//   out_of_bounds        a WRITE one byte past the region: IBV_WC_REM_ACCESS_ERR, buffer unchanged
//   region_not_readable  a READ of a region registered without IBV_ACCESS_REMOTE_READ: IBV_WC_REM_ACCESS_ERR
//   qp_not_writable      a WRITE through a target QP whose access flags allow only remote reads: REM_ACCESS_ERR
//   other_pd             a WRITE to a region of another PD than the target QP's: IBV_WC_REM_ACCESS_ERR
//   deregistered         a WRITE after the target deregistered the region (its memory kept): REM_ACCESS_ERR,
//                        buffer unchanged
//   target_in_error      a WRITE to a target QP moved to the error state: nothing executes, the initiator's retries
//                        run out (IBV_WC_RETRY_EXC_ERR), buffer unchanged
//   sends                a SEND of three SGEs, an inline SEND with immediate data and a SEND of no bytes into three
//                        receives of two SGEs (direct SENDs): the bytes, byte_len, imm_data, src_qp of each
//   send_too_long        a SEND longer than the receive: IBV_WC_REM_INV_REQ_ERR, IBV_WC_LOC_LEN_ERR at the target
//   sends_then_error     two SENDs complete; then the target moves its QP to the error state before polling: both
//                        arrive (in order, bytes in place), the third receive is flushed
//   write_stream         256 WRITEs of 40,000 bytes back to back, each to a range of its own: large enough to be
//                        shared with the target's process (HostDeviceTransport::CopyWrite), every byte in place
// Exit status 0 when every case passed; each case prints one line.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/verbs_process.h"

namespace {

namespace checks = uroce::checks;

constexpr size_t kBufferBytes = 64 << 10;
constexpr uint8_t kUntouched = 0x5a;
// The SEND cases' receives: WQE i takes [kReceiveAt + i * kReceiveStride, + kReceiveBytes) of the target's buffer, in
// two SGEs; the SENDs carry the initiator's bytes from its offset 0.
constexpr size_t kReceiveAt = 20000, kReceiveStride = 12000, kReceiveBytes = 11000;
constexpr uint32_t kImm = 0x11223344;
constexpr size_t kSendBytes[3] = {10000, 48, 0};
// write_stream: its WRITEs and their bytes, and byte i of the target's buffer as they leave it (from 100 on). Not of
// period 256, so that a piece placed at another multiple of 256 shows.
constexpr size_t kStreamWrites = 256, kStreamBytes = 40000;
uint8_t StreamByte(size_t i) { return uint8_t(i * 131 + (i >> 9) * 17 + 1); }

// What the target tells the initiator about one case's QP and region.
struct TargetInfo {
  uint32_t qpn;
  uint32_t rkey;
  uint64_t addr;
  uint64_t length;
};

enum class Case : int {
  kWriteThenRead,
  kInlineWrite,
  kBadRkey,
  kOutOfBounds,
  kRegionNotReadable,
  kQpNotWritable,
  kOtherPd,
  kDeregistered,
  kTargetInError,
  kSends,
  kSendTooLong,
  kSendsThenError,
  kWriteStream,
  kCount,
};

const char* Name(Case c) {
  static const char* names[] = {"write_then_read", "inline_write",   "bad_rkey",      "out_of_bounds",
                                "region_not_readable", "qp_not_writable", "other_pd", "deregistered",
                                "target_in_error", "sends", "send_too_long", "sends_then_error",
                                "write_stream"};
  return names[int(c)];
}

using checks::Die;
using checks::ReceiveAll;
using checks::SendAll;

struct Device : checks::Device {
  ibv_pd* other_pd = nullptr;
};

Device Open() {
  Device d{checks::OpenFirstDevice(64)};
  d.other_pd = ibv_alloc_pd(d.ctx);
  if (d.other_pd == nullptr) Die("ibv_alloc_pd");
  return d;
}

ibv_qp* CreateQp(Device& d) {
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = d.cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 16;
  a.cap.max_send_sge = a.cap.max_recv_sge = 4;
  a.cap.max_inline_data = 64;
  ibv_qp* qp = ibv_create_qp(d.pd, &a);
  if (qp == nullptr) Die("ibv_create_qp");
  return qp;
}

// The target's side of one case; writes whether its buffer holds what it should to `fd` at the end.
void Target(Device& d, int fd, Case c) {
  std::vector<uint8_t> buffer(c == Case::kWriteStream ? 100 + kStreamWrites * kStreamBytes + 100 : kBufferBytes,
                              kUntouched);
  int mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (c == Case::kRegionNotReadable) mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ibv_mr* mr = ibv_reg_mr(c == Case::kOtherPd ? d.other_pd : d.pd, buffer.data(), buffer.size(), mr_access);
  if (mr == nullptr) Die("ibv_reg_mr");
  ibv_qp* qp = CreateQp(d);
  TargetInfo info{qp->qp_num, mr->rkey, uint64_t(uintptr_t(buffer.data())), buffer.size()};
  SendAll(fd, &info, sizeof info);
  uint32_t peer_qpn;
  ReceiveAll(fd, &peer_qpn, sizeof peer_qpn);
  const int qp_access = c == Case::kQpNotWritable ? IBV_ACCESS_REMOTE_READ
                                                  : IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ConnectRc(d, qp, peer_qpn, qp_access);
  if (c == Case::kDeregistered && ibv_dereg_mr(mr) == 0) mr = nullptr;
  if (c == Case::kTargetInError) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) Die("to ERR");
  }
  const bool sends = c == Case::kSends || c == Case::kSendTooLong || c == Case::kSendsThenError;
  const int receives = c == Case::kSendTooLong ? 1 : 3;
  for (int i = 0; sends && i < receives; ++i) {
    const uintptr_t at = uintptr_t(buffer.data()) + kReceiveAt + i * kReceiveStride;
    const uint32_t total = c == Case::kSendTooLong ? 100 : kReceiveBytes;
    ibv_sge two[2] = {{at, 4000, mr->lkey}, {at + 4000, total - 4000, mr->lkey}};
    if (c == Case::kSendTooLong) two[0].length = 100;
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = 1000 + i;
    wr.sg_list = two;
    wr.num_sge = c == Case::kSendTooLong ? 1 : 2;
    if (ibv_post_recv(qp, &wr, &bad)) Die("ibv_post_recv");
  }
  const char ready = 'r';
  SendAll(fd, &ready, 1);
  char done;
  ReceiveAll(fd, &done, 1);  // the initiator has its completion
  bool ok = true;
  if (c == Case::kSendsThenError) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) Die("to ERR");
  }
  // The receive completions, in order: what each SEND must have given.
  for (int i = 0; sends && i < receives; ++i) {
    ibv_wc wc{};
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int n = 0;
    while (n == 0 && std::chrono::steady_clock::now() < give_up) n = ibv_poll_cq(d.cq, 1, &wc);
    ibv_wc_status want = IBV_WC_SUCCESS;
    if (c == Case::kSendTooLong) want = IBV_WC_LOC_LEN_ERR;
    if (c == Case::kSendsThenError && i == 2) want = IBV_WC_WR_FLUSH_ERR;
    const bool imm = c == Case::kSends && i == 1;
    if (n != 1 || wc.wr_id != uint64_t(1000 + i) || wc.status != want ||
        (want == IBV_WC_SUCCESS &&
         (wc.opcode != IBV_WC_RECV || wc.byte_len != kSendBytes[i] || wc.qp_num != qp->qp_num ||
          wc.src_qp != peer_qpn || bool(wc.wc_flags & IBV_WC_WITH_IMM) != imm || (imm && ntohl(wc.imm_data) != kImm)))) {
      fprintf(stderr,
              "direct_access_check: %s: receive %d: %d completions, wr_id %llu, status %s, opcode %d, byte_len %u, "
              "src_qp 0x%x, wc_flags 0x%x, imm 0x%x\n",
              Name(c), i, n, (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.opcode, wc.byte_len,
              wc.src_qp, wc.wc_flags, ntohl(wc.imm_data));
      ok = false;
    }
  }
  // What the buffer must hold: the pattern at 100.. for the cases that write it, else nothing changed.
  for (size_t i = 0; i < buffer.size(); ++i) {
    uint8_t want = kUntouched;
    if (c == Case::kWriteThenRead && i >= 100 && i < 100 + 10000) want = uint8_t(i * 7 + 1);
    if (c == Case::kInlineWrite && i >= 100 && i < 100 + 48) want = uint8_t(i * 7 + 1);
    if (c == Case::kWriteStream && i >= 100 && i < 100 + kStreamWrites * kStreamBytes) want = StreamByte(i);
    // A receive completed in error (IBV_WC_LOC_LEN_ERR) may hold any part of the message: its bytes are undefined.
    if (c == Case::kSendTooLong && i >= kReceiveAt && i < kReceiveAt + 100) continue;
    for (int k = 0; k < 2 && (c == Case::kSends || c == Case::kSendsThenError); ++k) {
      const size_t at = kReceiveAt + k * kReceiveStride;  // the initiator's byte j is (j + 100) * 7 + 1
      if (i >= at && i < at + kSendBytes[k]) want = uint8_t((i - at + 100) * 7 + 1);
    }
    if (buffer[i] != want) {
      fprintf(stderr, "direct_access_check: %s: target byte %zu is 0x%02x, want 0x%02x\n", Name(c), i, buffer[i], want);
      ok = false;
      break;
    }
  }
  SendAll(fd, &ok, sizeof ok);
  ibv_destroy_qp(qp);
  if (mr != nullptr) ibv_dereg_mr(mr);
}

// The initiator's side of one case: "" or what went wrong.
std::string Initiator(Device& d, int fd, Case c) {
  TargetInfo t;
  ReceiveAll(fd, &t, sizeof t);
  ibv_qp* qp = CreateQp(d);
  SendAll(fd, &qp->qp_num, sizeof qp->qp_num);
  ConnectRc(d, qp, t.qpn, 0);
  std::vector<uint8_t> local(c == Case::kWriteStream ? kStreamWrites * kStreamBytes : kBufferBytes, 0);
  for (size_t i = 0; i < local.size(); ++i) {  // the target's pattern at 100+i
    local[i] = c == Case::kWriteStream ? StreamByte(i + 100) : uint8_t((i + 100) * 7 + 1);
  }
  ibv_mr* mr = ibv_reg_mr(d.pd, local.data(), local.size(), IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) Die("ibv_reg_mr (initiator)");
  char ready;
  ReceiveAll(fd, &ready, 1);

  std::string problem;
  auto post = [&](ibv_wr_opcode op, ibv_sge* sges, int n, uint64_t remote, uint32_t rkey, int flags) {
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = 42;
    wr.opcode = op;
    wr.sg_list = sges;
    wr.num_sge = n;
    wr.send_flags = IBV_SEND_SIGNALED | flags;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(qp, &wr, &bad)) Die("ibv_post_send");
    ibv_wc wc{};
    if (!checks::PollOne(d.cq, &wc, 10)) return std::string("no completion within 10 s");
    return std::string(wc.status == IBV_WC_SUCCESS ? "" : ibv_wc_status_str(wc.status)) +
           (wc.wr_id != 42 ? " (wrong wr_id)" : "");
  };
  auto post_imm = [&](ibv_sge* sges, int n, int flags) {
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = 42;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = htonl(kImm);
    wr.sg_list = sges;
    wr.num_sge = n;
    wr.send_flags = IBV_SEND_SIGNALED | flags;
    if (ibv_post_send(qp, &wr, &bad)) Die("ibv_post_send");
    ibv_wc wc{};
    if (!checks::PollOne(d.cq, &wc, 10)) return std::string("no completion within 10 s");
    return std::string(wc.status == IBV_WC_SUCCESS ? "" : ibv_wc_status_str(wc.status));
  };
  auto expect = [&](const std::string& got, const char* want) {
    if (got != want) problem += std::string("completion '") + got + "', want '" + want + "'; ";
  };
  const uint64_t at = t.addr + 100;
  ibv_sge three[3] = {{uintptr_t(local.data()), 3000, mr->lkey},
                      {uintptr_t(local.data()) + 3000, 5000, mr->lkey},
                      {uintptr_t(local.data()) + 8000, 2000, mr->lkey}};
  switch (c) {
    case Case::kWriteThenRead: {
      expect(post(IBV_WR_RDMA_WRITE, three, 3, at, t.rkey, 0), "");
      std::vector<uint8_t> back(10000, 0);
      ibv_mr* back_mr = ibv_reg_mr(d.pd, back.data(), back.size(), IBV_ACCESS_LOCAL_WRITE);
      if (back_mr == nullptr) Die("ibv_reg_mr (read back)");
      ibv_sge two[2] = {{uintptr_t(back.data()), 4096, back_mr->lkey},
                        {uintptr_t(back.data()) + 4096, 10000 - 4096, back_mr->lkey}};
      expect(post(IBV_WR_RDMA_READ, two, 2, at, t.rkey, 0), "");
      if (std::memcmp(back.data(), local.data(), back.size()) != 0) problem += "READ returned other bytes; ";
      ibv_dereg_mr(back_mr);
      break;
    }
    case Case::kInlineWrite: {
      ibv_sge inl = {uintptr_t(local.data()), 48, 0};
      expect(post(IBV_WR_RDMA_WRITE, &inl, 1, at, t.rkey, IBV_SEND_INLINE), "");
      break;
    }
    case Case::kBadRkey:
      expect(post(IBV_WR_RDMA_WRITE, three, 1, at, t.rkey ^ 0x5500, 0), "remote access error");
      break;
    case Case::kOutOfBounds:
      expect(post(IBV_WR_RDMA_WRITE, three, 1, t.addr + t.length - 2999, t.rkey, 0), "remote access error");
      break;
    case Case::kRegionNotReadable:
      expect(post(IBV_WR_RDMA_READ, three, 1, at, t.rkey, 0), "remote access error");
      break;
    case Case::kQpNotWritable:
    case Case::kOtherPd:
    case Case::kDeregistered:
      expect(post(IBV_WR_RDMA_WRITE, three, 1, at, t.rkey, 0), "remote access error");
      break;
    case Case::kTargetInError:
      expect(post(IBV_WR_RDMA_WRITE, three, 1, at, t.rkey, 0), "transport retry counter exceeded");
      break;
    case Case::kSends: {
      expect(post(IBV_WR_SEND, three, 3, 0, 0, 0), "");
      ibv_sge inl = {uintptr_t(local.data()), uint32_t(kSendBytes[1]), 0};
      expect(post_imm(&inl, 1, IBV_SEND_INLINE), "");
      expect(post(IBV_WR_SEND, nullptr, 0, 0, 0, 0), "");
      break;
    }
    case Case::kSendTooLong:
      expect(post(IBV_WR_SEND, three, 1, 0, 0, 0), "remote invalid request error");
      break;
    case Case::kSendsThenError: {
      ibv_sge first = {uintptr_t(local.data()), uint32_t(kSendBytes[0]), mr->lkey};
      ibv_sge second = {uintptr_t(local.data()), uint32_t(kSendBytes[1]), mr->lkey};
      expect(post(IBV_WR_SEND, &first, 1, 0, 0, 0), "");
      expect(post(IBV_WR_SEND, &second, 1, 0, 0, 0), "");
      break;
    }
    case Case::kWriteStream:
      // Each posted as soon as the one before completed: a stream, as ib_write_bw's.
      for (size_t k = 0; k < kStreamWrites && problem.empty(); ++k) {
        ibv_sge piece = {uintptr_t(local.data()) + k * kStreamBytes, uint32_t(kStreamBytes), mr->lkey};
        expect(post(IBV_WR_RDMA_WRITE, &piece, 1, at + k * kStreamBytes, t.rkey, 0), "");
      }
      break;
    case Case::kCount:
      break;
  }
  const char done = 'd';
  SendAll(fd, &done, 1);
  bool target_ok = false;
  ReceiveAll(fd, &target_ok, sizeof target_ok);
  if (!target_ok) problem += "the target's buffer is not what it should be; ";
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  return problem;
}

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  uroce::checks::program = "direct_access_check";
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) < 0) Die("socketpair");
  const pid_t child = fork();
  if (child < 0) Die("fork");
  if (child == 0) {
    close(pair[0]);
    Device d = Open();
    for (int c = 0; c < int(Case::kCount); ++c) Target(d, pair[1], Case(c));
    ibv_close_device(d.ctx);  // (the rest goes with the process)
    _exit(0);
  }
  close(pair[1]);
  Device d = Open();
  int failed = 0;
  for (int c = 0; c < int(Case::kCount); ++c) {
    const std::string problem = Initiator(d, pair[0], Case(c));
    printf("direct_access_check: %s: %s\n", Name(Case(c)), problem.empty() ? "ok" : problem.c_str());
    failed += !problem.empty();
  }
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    printf("direct_access_check: the target process ended with status 0x%x\n", status);
    ++failed;
  }
  printf("direct_access_check: %d of %d cases failed\n", failed, int(Case::kCount));
  return failed == 0 ? 0 : 1;
}
