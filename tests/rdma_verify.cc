// rdma_verify: an RC data-integrity checker written against the plain verbs API, like any other RDMA client. It links
// with -libverbs and, at run time, LD_LIBRARY_PATH chooses which libibverbs.so.1 (and so which device) it talks to.
//
// Two processes: a server that registers a buffer and then never touches it, and a client that performs N seeded
// random operations on it through one RC QP: RDMA WRITE of random ranges, RDMA READ of random ranges, ATOMIC
// FETCH_AND_ADD and CMP_AND_SWAP on an array of 8-byte counters at the end of the buffer. The client keeps a model
// of the server's buffer: every READ must return exactly the model's bytes, every atomic must return the model's
// original value, and at the end the server compares its whole buffer with the model the client sends it.
//
// Usage:
//   rdma_verify --role=server --port=P [--seed=S] [--buf-kib=1024] [--counters=64] [common options]
//   rdma_verify --role=client --port=P [--host=127.0.0.1] [--ops=2000] [--seed=S] [--window=16] [--fence]
//                [common options]
// common options: --dev=NAME (default: the first device) --gid-index=0 --ib-port=1 --mtu=1024 --qp-timeout=14
//                 --max-size=262144 --stall-seconds=60
//
// Keys, QPN, PSN, GID and the buffer's address travel over one TCP connection (the out-of-band exchange every
// verbs program needs). Exit status 0 only when every completion succeeded and every byte matched.
//
// Ordering facts the model relies on (IBTA 1.4 vol 1, 9.5 and 10.8.3): an RC responder executes requests in PSN
// order, so a READ sees every earlier WRITE and atomic of the same QP. A READ that is retried is executed again
// (9.7.5.1.2), so it may observe a WRITE or atomic posted after it; a requester prevents that with the fence
// indicator (IBV_SEND_FENCE: the WR waits for earlier READs and atomics to complete, 10.8.3.3) or by not posting a
// conflicting modification while the READ is outstanding. The client does the latter by default and uses the fence
// with --fence. Atomics are not re-executed on retry (the responder answers duplicates from its saved results,
// 9.7.5.1.3), so they need neither.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using SteadyClock = std::chrono::steady_clock;

// ------------------------------------------------------------------------------------------------------------------
// Options
// ------------------------------------------------------------------------------------------------------------------

struct Options {
  std::string role;
  std::string host = "127.0.0.1";
  int port = 0;
  std::string dev;
  int gid_index = 0;
  int ib_port = 1;
  int mtu = 1024;
  int qp_timeout = 14;  // 4.096 us * 2^14 = 67 ms, what ibv_rc_pingpong and perftest use
  uint64_t seed = 1;
  uint64_t ops = 2000;
  size_t buf_bytes = 1024 * 1024;
  size_t counters = 64;
  size_t max_size = 256 * 1024;
  size_t window = 16;
  bool fence = false;
  int stall_seconds = 60;
};

bool ParseUnsigned(const char* text, uint64_t* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 0);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

void Usage() {
  std::fprintf(stderr,
               "usage: rdma_verify --role=server|client --port=P [--host=H] [--ops=N] [--seed=S] [--buf-kib=K]\n"
               "       [--counters=C] [--window=W] [--fence] [--dev=NAME] [--gid-index=G] [--ib-port=I]\n"
               "       [--mtu=256..4096] [--qp-timeout=T] [--max-size=BYTES] [--stall-seconds=S]\n");
}

std::optional<Options> ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--fence") {
      o.fence = true;
      continue;
    }
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "rdma_verify: unexpected argument '%s'\n", arg.c_str());
      return std::nullopt;
    }
    const std::string key = arg.substr(2, eq - 2);
    const std::string value = arg.substr(eq + 1);
    uint64_t n = 0;
    const bool numeric = ParseUnsigned(value.c_str(), &n);
    if (key == "role") {
      o.role = value;
    } else if (key == "host") {
      o.host = value;
    } else if (key == "dev") {
      o.dev = value;
    } else if (!numeric) {
      std::fprintf(stderr, "rdma_verify: --%s needs a number, got '%s'\n", key.c_str(), value.c_str());
      return std::nullopt;
    } else if (key == "port") {
      o.port = static_cast<int>(n);
    } else if (key == "gid-index") {
      o.gid_index = static_cast<int>(n);
    } else if (key == "ib-port") {
      o.ib_port = static_cast<int>(n);
    } else if (key == "mtu") {
      o.mtu = static_cast<int>(n);
    } else if (key == "qp-timeout") {
      o.qp_timeout = static_cast<int>(n);
    } else if (key == "seed") {
      o.seed = n;
    } else if (key == "ops") {
      o.ops = n;
    } else if (key == "buf-kib") {
      o.buf_bytes = static_cast<size_t>(n) * 1024;
    } else if (key == "counters") {
      o.counters = static_cast<size_t>(n);
    } else if (key == "max-size") {
      o.max_size = static_cast<size_t>(n);
    } else if (key == "window") {
      o.window = static_cast<size_t>(n);
    } else if (key == "stall-seconds") {
      o.stall_seconds = static_cast<int>(n);
    } else {
      std::fprintf(stderr, "rdma_verify: unknown option --%s\n", key.c_str());
      return std::nullopt;
    }
  }
  if ((o.role != "server" && o.role != "client") || o.port <= 0 || o.port > 65535 || o.buf_bytes == 0 ||
      o.counters == 0 || o.max_size == 0 || o.window == 0 || o.window > 1024 || o.qp_timeout > 31) {
    return std::nullopt;
  }
  if (o.max_size > o.buf_bytes) o.max_size = o.buf_bytes;
  return o;
}

ibv_mtu MtuEnum(int mtu) {
  switch (mtu) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
    default: return IBV_MTU_1024;
  }
}

// ------------------------------------------------------------------------------------------------------------------
// Deterministic randomness and the initial buffer contents (both sides compute the same)
// ------------------------------------------------------------------------------------------------------------------

// SplitMix64 (Steele, Lea, Flood 2014): small, fast, good enough for test data; the same sequence on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi].
  uint64_t Range(uint64_t lo, uint64_t hi) { return lo + Next() % (hi - lo + 1); }
  void Fill(uint8_t* p, size_t n) {
    while (n >= 8) {
      const uint64_t v = Next();
      std::memcpy(p, &v, 8);
      p += 8;
      n -= 8;
    }
    if (n > 0) {
      const uint64_t v = Next();
      std::memcpy(p, &v, n);
    }
  }

 private:
  uint64_t state_;
};

void InitialContents(uint64_t pattern_seed, uint8_t* p, size_t n) {
  Rng rng(pattern_seed ^ 0x5eed0f5e4f3b0f5eull);
  rng.Fill(p, n);
}

// ------------------------------------------------------------------------------------------------------------------
// TCP exchange
// ------------------------------------------------------------------------------------------------------------------

bool WriteAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

int ServerAccept(int port) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0) return -errno;
  const int one = 1;
  ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(lfd, 1) != 0) {
    const int err = errno;
    ::close(lfd);
    return -err;
  }
  int fd;
  do {
    fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  const int err = errno;
  ::close(lfd);
  return fd >= 0 ? fd : -err;
}

int ClientConnect(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return -EINVAL;
  // The server may still be setting up its device; retry for a while as pingpong-style clients' users expect.
  const auto deadline = SteadyClock::now() + std::chrono::seconds(20);
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    const int err = errno;
    ::close(fd);
    if (SteadyClock::now() > deadline) return -err;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// What each side tells the other (same host, same layout: sent as raw bytes).
struct Endpoint {
  uint32_t qpn;
  uint32_t psn;
  uint8_t gid[16];
  uint32_t rkey;
  uint32_t pad;
  uint64_t addr;         // server: the buffer's virtual address; client: 0
  uint64_t buf_bytes;    // server: data region size
  uint64_t counters;     // server: number of 8-byte counters after the data region
  uint64_t pattern_seed; // server: seed of the buffer's initial contents
};

// ------------------------------------------------------------------------------------------------------------------
// Verbs resources
// ------------------------------------------------------------------------------------------------------------------

struct Verbs {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_device_attr dev_attr{};
  ibv_gid gid{};

  ~Verbs() {
    if (qp != nullptr) ibv_destroy_qp(qp);
    if (cq != nullptr) ibv_destroy_cq(cq);
    if (pd != nullptr) ibv_dealloc_pd(pd);
    if (ctx != nullptr) ibv_close_device(ctx);
  }
};

bool OpenVerbs(const Options& o, int cq_depth, int sq_depth, Verbs* v) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) {
    std::fprintf(stderr, "rdma_verify: no RDMA device (ibv_get_device_list: %s)\n", std::strerror(errno));
    if (list != nullptr) ibv_free_device_list(list);
    return false;
  }
  ibv_device* chosen = nullptr;
  for (int i = 0; i < n; ++i) {
    if (o.dev.empty() || o.dev == ibv_get_device_name(list[i])) {
      chosen = list[i];
      break;
    }
  }
  if (chosen == nullptr) {
    std::fprintf(stderr, "rdma_verify: device %s not found\n", o.dev.c_str());
    ibv_free_device_list(list);
    return false;
  }
  v->ctx = ibv_open_device(chosen);
  ibv_free_device_list(list);
  if (v->ctx == nullptr) {
    std::fprintf(stderr, "rdma_verify: ibv_open_device: %s\n", std::strerror(errno));
    return false;
  }
  if (ibv_query_device(v->ctx, &v->dev_attr) != 0) {
    std::fprintf(stderr, "rdma_verify: ibv_query_device failed\n");
    return false;
  }
  if (ibv_query_gid(v->ctx, static_cast<uint8_t>(o.ib_port), o.gid_index, &v->gid) != 0) {
    std::fprintf(stderr, "rdma_verify: ibv_query_gid(port %d, index %d) failed\n", o.ib_port, o.gid_index);
    return false;
  }
  v->pd = ibv_alloc_pd(v->ctx);
  v->cq = v->pd != nullptr ? ibv_create_cq(v->ctx, cq_depth, nullptr, nullptr, 0) : nullptr;
  if (v->cq == nullptr) {
    std::fprintf(stderr, "rdma_verify: ibv_alloc_pd/ibv_create_cq: %s\n", std::strerror(errno));
    return false;
  }
  ibv_qp_init_attr init{};
  init.send_cq = v->cq;
  init.recv_cq = v->cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = static_cast<uint32_t>(sq_depth);
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.sq_sig_all = 1;
  v->qp = ibv_create_qp(v->pd, &init);
  if (v->qp == nullptr) {
    std::fprintf(stderr, "rdma_verify: ibv_create_qp: %s\n", std::strerror(errno));
    return false;
  }
  return true;
}

// RESET -> INIT -> RTR -> RTS with the peer's QPN/PSN/GID (IBTA 10.3.1 / ibv_modify_qp(3) required attributes).
bool ConnectQp(const Options& o, Verbs* v, const Endpoint& local, const Endpoint& remote, int rd_atomic) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(o.ib_port);
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  int rc = ibv_modify_qp(v->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) {
    std::fprintf(stderr, "rdma_verify: modify to INIT: %s\n", std::strerror(rc));
    return false;
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = MtuEnum(o.mtu);
  a.dest_qp_num = remote.qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = static_cast<uint8_t>(rd_atomic);
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(o.gid_index);
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.port_num = static_cast<uint8_t>(o.ib_port);
  rc = ibv_modify_qp(v->qp, &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) {
    std::fprintf(stderr, "rdma_verify: modify to RTR: %s\n", std::strerror(rc));
    return false;
  }
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = static_cast<uint8_t>(o.qp_timeout);
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = local.psn;
  a.max_rd_atomic = static_cast<uint8_t>(rd_atomic);
  rc = ibv_modify_qp(v->qp, &a,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) {
    std::fprintf(stderr, "rdma_verify: modify to RTS: %s\n", std::strerror(rc));
    return false;
  }
  return true;
}

int RdAtomicDepth(const Verbs& v) {
  return std::max(1, std::min({16, v.dev_attr.max_qp_rd_atom, v.dev_attr.max_qp_init_rd_atom}));
}

// A page-aligned buffer (atomics need 8-byte alignment; page alignment is what registered buffers usually have).
struct AlignedBuffer {
  uint8_t* p = nullptr;
  size_t n = 0;
  explicit AlignedBuffer(size_t bytes) : n(bytes) {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    p = static_cast<uint8_t*>(std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded));
  }
  ~AlignedBuffer() { std::free(p); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};

Endpoint LocalEndpoint(const Verbs& v, uint64_t psn_seed) {
  Endpoint e{};
  e.qpn = v.qp->qp_num;
  e.psn = static_cast<uint32_t>(Rng(psn_seed).Next() & 0xffffff);
  std::memcpy(e.gid, v.gid.raw, 16);
  return e;
}

// ------------------------------------------------------------------------------------------------------------------
// Server
// ------------------------------------------------------------------------------------------------------------------

int RunServer(const Options& o) {
  const size_t total = o.buf_bytes + 8 * o.counters;
  AlignedBuffer buf(total);
  if (buf.p == nullptr) return 2;
  const uint64_t pattern_seed = o.seed;
  InitialContents(pattern_seed, buf.p, total);

  Verbs v;
  if (!OpenVerbs(o, 4, 4, &v)) return 2;
  ibv_mr* mr = ibv_reg_mr(v.pd, buf.p, total,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                              IBV_ACCESS_REMOTE_ATOMIC);
  if (mr == nullptr) {
    std::fprintf(stderr, "rdma_verify server: ibv_reg_mr(%zu bytes): %s\n", total, std::strerror(errno));
    return 2;
  }
  Endpoint local = LocalEndpoint(v, o.seed * 7919 + 1);
  local.rkey = mr->rkey;
  local.addr = reinterpret_cast<uintptr_t>(buf.p);
  local.buf_bytes = o.buf_bytes;
  local.counters = o.counters;
  local.pattern_seed = pattern_seed;
  // What the program "prints" of itself, as the Debian clients print theirs: an attacker on the host knows it.
  std::printf("rdma_verify server: QPN 0x%06x\n", local.qpn);
  std::fflush(stdout);

  const int fd = ServerAccept(o.port);
  if (fd < 0) {
    std::fprintf(stderr, "rdma_verify server: TCP port %d: %s\n", o.port, std::strerror(-fd));
    return 2;
  }
  Endpoint remote{};
  if (!ReadAll(fd, &remote, sizeof(remote)) || !WriteAll(fd, &local, sizeof(local))) {
    std::fprintf(stderr, "rdma_verify server: endpoint exchange failed\n");
    return 2;
  }
  if (!ConnectQp(o, &v, local, remote, RdAtomicDepth(v))) return 2;
  // Tell the client the QP is in RTR (it must not send before, IBTA 10.3.1: packets to a QP in INIT are dropped).
  const uint8_t ready = 1;
  if (!WriteAll(fd, &ready, 1)) return 2;

  // The client's final model of the whole buffer; until it arrives, only the HCA touches the buffer.
  uint64_t model_bytes = 0;
  if (!ReadAll(fd, &model_bytes, sizeof(model_bytes))) {
    std::fprintf(stderr, "rdma_verify server: the client went away before sending its model\n");
    return 1;
  }
  if (model_bytes != total) {
    std::fprintf(stderr, "rdma_verify server: model of %" PRIu64 " bytes, buffer has %zu\n", model_bytes, total);
    return 1;
  }
  std::vector<uint8_t> model(total);
  if (!ReadAll(fd, model.data(), total)) {
    std::fprintf(stderr, "rdma_verify server: short model\n");
    return 1;
  }
  uint64_t mismatched = 0;
  int64_t first = -1;
  for (size_t i = 0; i < total; ++i) {
    if (buf.p[i] != model[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++mismatched;
    }
  }
  const uint64_t reply[2] = {mismatched, static_cast<uint64_t>(first)};
  WriteAll(fd, reply, sizeof(reply));
  // Wait for the client to close (so our QP outlives its last ACKs).
  uint8_t byte;
  ReadAll(fd, &byte, 1);
  ::close(fd);
  if (first >= 0) {
    std::fprintf(stderr, "rdma_verify server: first mismatch at offset %" PRId64 ": have 0x%02x, model 0x%02x\n",
                 first, buf.p[first], model[static_cast<size_t>(first)]);
  }
  std::printf("rdma_verify server: buffer %zu bytes, mismatched bytes %" PRIu64 "\n", total, mismatched);
  ibv_dereg_mr(mr);
  return mismatched == 0 ? 0 : 1;
}

// ------------------------------------------------------------------------------------------------------------------
// Client
// ------------------------------------------------------------------------------------------------------------------

enum class OpKind { kWrite, kRead, kFetchAdd, kCmpSwap };

const char* KindName(OpKind k) {
  switch (k) {
    case OpKind::kWrite: return "WRITE";
    case OpKind::kRead: return "READ";
    case OpKind::kFetchAdd: return "FETCH_ADD";
    case OpKind::kCmpSwap: return "CMP_SWAP";
  }
  return "?";
}

struct Outstanding {
  bool busy = false;
  uint64_t index = 0;  // operation number
  OpKind kind = OpKind::kWrite;
  size_t offset = 0;   // into the server's buffer
  size_t length = 0;
  std::vector<uint8_t> expected;  // READ: the model's bytes at post time
  uint64_t expected_original = 0;  // atomics
};

struct Stats {
  uint64_t writes = 0, reads = 0, fetch_adds = 0, cmp_swaps = 0, swaps_taken = 0;
  uint64_t bytes_written = 0, bytes_read = 0;
  uint64_t mismatches = 0;   // operations whose result differed from the model
  uint64_t fences = 0, conflict_waits = 0;
};

class Client {
 public:
  Client(const Options& o, Verbs* v, const Endpoint& remote, uint8_t* local, ibv_mr* local_mr)
      : o_(o), v_(v), remote_(remote), local_(local), local_mr_(local_mr), slots_(o.window), rng_(o.seed) {
    total_ = remote.buf_bytes + 8 * remote.counters;
    model_.resize(total_);
    InitialContents(remote.pattern_seed, model_.data(), total_);
  }

  const std::vector<uint8_t>& model() const { return model_; }
  const Stats& stats() const { return stats_; }

  // Runs all operations; false on a failed completion, a stall, or a post error (mismatches are counted, not fatal).
  bool Run() {
    for (uint64_t i = 0; i < o_.ops; ++i) {
      if (!PostOne(i)) return false;
    }
    while (in_flight_ > 0) {
      if (!Reap(true)) return false;
    }
    return true;
  }

 private:
  uint8_t* SlotMemory(size_t slot) { return local_ + slot * o_.max_size; }

  bool Overlaps(const Outstanding& s, size_t off, size_t len) const {
    return s.offset < off + len && off < s.offset + s.length;
  }
  bool ConflictsWithOutstandingRead(size_t off, size_t len) const {
    for (const Outstanding& s : slots_) {
      if (s.busy && s.kind == OpKind::kRead && Overlaps(s, off, len)) return true;
    }
    return false;
  }

  size_t RandomSize() {
    // Log-uniform up to max_size: as many 1..16-byte operations as 64..256 KiB ones.
    const int bits = 64 - __builtin_clzll(static_cast<unsigned long long>(o_.max_size));
    const uint64_t cap = std::min<uint64_t>(o_.max_size, 1ull << rng_.Range(0, static_cast<uint64_t>(bits - 1)));
    return static_cast<size_t>(rng_.Range(1, cap));
  }

  bool PostOne(uint64_t index) {
    // Choose the operation first (the sequence depends only on the seed, not on timing).
    const uint64_t dice = rng_.Range(0, 99);
    OpKind kind;
    size_t offset = 0, length = 8;
    uint64_t operand = 0, swap = 0;
    if (dice < 40) {
      kind = OpKind::kWrite;
      length = RandomSize();
      offset = static_cast<size_t>(rng_.Range(0, remote_.buf_bytes - length));
    } else if (dice < 75) {
      kind = OpKind::kRead;
      length = std::min(RandomSize(), total_);
      // READs cover the counters too, which checks the atomics' effect on memory.
      offset = static_cast<size_t>(rng_.Range(0, total_ - length));
    } else {
      kind = dice < 88 ? OpKind::kFetchAdd : OpKind::kCmpSwap;
      offset = remote_.buf_bytes + 8 * static_cast<size_t>(rng_.Range(0, remote_.counters - 1));
      operand = rng_.Next();
      swap = rng_.Next();
    }

    const bool modifies = kind != OpKind::kRead;
    bool fence = false;
    if (modifies && ConflictsWithOutstandingRead(offset, length)) {
      if (o_.fence) {
        fence = true;
        ++stats_.fences;
      } else {
        ++stats_.conflict_waits;
        while (ConflictsWithOutstandingRead(offset, length)) {
          if (!Reap(true)) return false;
        }
      }
    }
    // A free slot (and room in the send queue and for READs/atomics in flight).
    while (in_flight_ >= slots_.size()) {
      if (!Reap(true)) return false;
    }
    size_t slot = 0;
    while (slots_[slot].busy) ++slot;
    Outstanding& s = slots_[slot];
    s.busy = true;
    s.index = index;
    s.kind = kind;
    s.offset = offset;
    s.length = length;
    s.expected.clear();

    uint8_t* mem = SlotMemory(slot);
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(mem);
    sge.length = static_cast<uint32_t>(length);
    sge.lkey = local_mr_->lkey;
    ibv_send_wr wr{};
    wr.wr_id = slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED | (fence ? IBV_SEND_FENCE : 0);
    const uint64_t remote_addr = remote_.addr + offset;
    switch (kind) {
      case OpKind::kWrite:
        rng_.Fill(mem, length);
        std::memcpy(model_.data() + offset, mem, length);
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.wr.rdma.remote_addr = remote_addr;
        wr.wr.rdma.rkey = remote_.rkey;
        ++stats_.writes;
        stats_.bytes_written += length;
        break;
      case OpKind::kRead:
        // Poison the destination, so a READ that completes without writing it cannot pass.
        std::memset(mem, static_cast<int>(~model_[offset] & 0xff), length);
        s.expected.assign(model_.begin() + static_cast<std::ptrdiff_t>(offset),
                          model_.begin() + static_cast<std::ptrdiff_t>(offset + length));
        wr.opcode = IBV_WR_RDMA_READ;
        wr.wr.rdma.remote_addr = remote_addr;
        wr.wr.rdma.rkey = remote_.rkey;
        ++stats_.reads;
        stats_.bytes_read += length;
        break;
      case OpKind::kFetchAdd:
      case OpKind::kCmpSwap: {
        uint64_t current;
        std::memcpy(&current, model_.data() + offset, 8);
        s.expected_original = current;
        std::memset(mem, 0xa5, 8);
        wr.wr.atomic.remote_addr = remote_addr;
        wr.wr.atomic.rkey = remote_.rkey;
        uint64_t next = current;
        if (kind == OpKind::kFetchAdd) {
          wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
          wr.wr.atomic.compare_add = operand;
          next = current + operand;
          ++stats_.fetch_adds;
        } else {
          // Half of the compares use the current value (the swap happens), half a random one (it does not).
          const uint64_t compare = (operand & 1) != 0 ? current : operand;
          wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
          wr.wr.atomic.compare_add = compare;
          wr.wr.atomic.swap = swap;
          if (compare == current) {
            next = swap;
            ++stats_.swaps_taken;
          }
          ++stats_.cmp_swaps;
        }
        std::memcpy(model_.data() + offset, &next, 8);
        break;
      }
    }
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(v_->qp, &wr, &bad);
    if (rc != 0) {
      std::fprintf(stderr, "rdma_verify client: ibv_post_send(op %" PRIu64 " %s off %zu len %zu): %s\n", index,
                   KindName(kind), offset, length, std::strerror(rc));
      return false;
    }
    ++in_flight_;
    last_progress_ = SteadyClock::now();
    return true;
  }

  // Polls completions; with `block`, waits until at least one arrives (or the stall deadline passes).
  bool Reap(bool block) {
    ibv_wc wc[16];
    for (;;) {
      const int n = ibv_poll_cq(v_->cq, 16, wc);
      if (n < 0) {
        std::fprintf(stderr, "rdma_verify client: ibv_poll_cq failed (%d)\n", n);
        return false;
      }
      for (int i = 0; i < n; ++i) {
        if (!Complete(wc[i])) return false;
      }
      if (n > 0) {
        last_progress_ = SteadyClock::now();
        return true;
      }
      if (!block) return true;
      if (SteadyClock::now() - last_progress_ > std::chrono::seconds(o_.stall_seconds)) {
        std::fprintf(stderr, "rdma_verify client: STALLED: no completion for %d s with %zu operations in flight:\n",
                     o_.stall_seconds, in_flight_);
        for (const Outstanding& s : slots_) {
          if (s.busy) {
            std::fprintf(stderr, "  op %" PRIu64 " %s offset %zu length %zu\n", s.index, KindName(s.kind), s.offset,
                         s.length);
          }
        }
        return false;
      }
    }
  }

  bool Complete(const ibv_wc& wc) {
    if (wc.wr_id >= slots_.size() || !slots_[wc.wr_id].busy) {
      std::fprintf(stderr, "rdma_verify client: completion with unknown wr_id %" PRIu64 "\n", wc.wr_id);
      return false;
    }
    Outstanding& s = slots_[wc.wr_id];
    if (wc.status != IBV_WC_SUCCESS) {
      std::fprintf(stderr, "rdma_verify client: op %" PRIu64 " %s offset %zu length %zu completed with %s (%d)\n",
                   s.index, KindName(s.kind), s.offset, s.length, ibv_wc_status_str(wc.status), wc.status);
      return false;
    }
    const uint8_t* mem = SlotMemory(wc.wr_id);
    switch (s.kind) {
      case OpKind::kWrite:
        break;
      case OpKind::kRead:
        if (std::memcmp(mem, s.expected.data(), s.length) != 0) {
          size_t first = 0, bad = 0;
          for (size_t i = 0; i < s.length; ++i) {
            if (mem[i] != s.expected[i]) {
              if (bad == 0) first = i;
              ++bad;
            }
          }
          ++stats_.mismatches;
          if (stats_.mismatches <= 10) {
            std::fprintf(stderr,
                         "rdma_verify client: MISMATCH op %" PRIu64 " READ offset %zu length %zu: %zu bytes differ, "
                         "first at +%zu (got 0x%02x, model 0x%02x)\n",
                         s.index, s.offset, s.length, bad, first, mem[first], s.expected[first]);
          }
        }
        break;
      case OpKind::kFetchAdd:
      case OpKind::kCmpSwap: {
        uint64_t got;
        std::memcpy(&got, mem, 8);
        if (got != s.expected_original) {
          ++stats_.mismatches;
          if (stats_.mismatches <= 10) {
            std::fprintf(stderr,
                         "rdma_verify client: MISMATCH op %" PRIu64 " %s counter offset %zu: original 0x%016" PRIx64
                         ", model 0x%016" PRIx64 "\n",
                         s.index, KindName(s.kind), s.offset, got, s.expected_original);
          }
        }
        break;
      }
    }
    s.busy = false;
    s.expected.clear();
    --in_flight_;
    return true;
  }

  const Options& o_;
  Verbs* v_;
  Endpoint remote_;
  uint8_t* local_;
  ibv_mr* local_mr_;
  std::vector<Outstanding> slots_;
  Rng rng_;
  size_t total_ = 0;
  std::vector<uint8_t> model_;
  size_t in_flight_ = 0;
  Stats stats_;
  SteadyClock::time_point last_progress_ = SteadyClock::now();
};

int RunClient(const Options& o) {
  Verbs v;
  const int sq_depth = static_cast<int>(o.window);
  if (!OpenVerbs(o, sq_depth * 2, sq_depth, &v)) return 2;
  // READs and atomics in flight are bounded by max_rd_atomic; the window stays within the SQ.
  Options opts = o;
  AlignedBuffer local(opts.window * opts.max_size);
  if (local.p == nullptr) return 2;
  ibv_mr* mr = ibv_reg_mr(v.pd, local.p, local.n, IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) {
    std::fprintf(stderr, "rdma_verify client: ibv_reg_mr: %s\n", std::strerror(errno));
    return 2;
  }
  const int fd = ClientConnect(o.host, o.port);
  if (fd < 0) {
    std::fprintf(stderr, "rdma_verify client: connect %s:%d: %s\n", o.host.c_str(), o.port, std::strerror(-fd));
    return 2;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const Endpoint local_ep = LocalEndpoint(v, o.seed * 104729 + 3);
  Endpoint remote{};
  uint8_t ready = 0;
  if (!WriteAll(fd, &local_ep, sizeof(local_ep)) || !ReadAll(fd, &remote, sizeof(remote))) {
    std::fprintf(stderr, "rdma_verify client: endpoint exchange failed\n");
    return 2;
  }
  if (remote.buf_bytes < opts.max_size) opts.max_size = remote.buf_bytes;
  if (!ConnectQp(opts, &v, local_ep, remote, RdAtomicDepth(v))) return 2;
  if (!ReadAll(fd, &ready, 1)) {
    std::fprintf(stderr, "rdma_verify client: the server did not become ready\n");
    return 2;
  }

  const auto start = SteadyClock::now();
  Client client(opts, &v, remote, local.p, mr);
  const bool ran = client.Run();
  const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - start);
  const Stats& st = client.stats();

  uint64_t server_mismatched = UINT64_MAX;
  int64_t server_first = -1;
  if (ran) {
    const uint64_t n = client.model().size();
    uint64_t reply[2] = {0, 0};
    if (WriteAll(fd, &n, sizeof(n)) && WriteAll(fd, client.model().data(), n) && ReadAll(fd, reply, sizeof(reply))) {
      server_mismatched = reply[0];
      server_first = static_cast<int64_t>(reply[1]);
    } else {
      std::fprintf(stderr, "rdma_verify client: the final model exchange with the server failed\n");
    }
  }
  ::close(fd);
  if (server_mismatched != 0 && server_mismatched != UINT64_MAX) {
    std::fprintf(stderr, "rdma_verify client: the server's buffer differs from the model in %" PRIu64
                         " bytes, first at offset %" PRId64 "\n",
                 server_mismatched, server_first);
  }
  const bool ok = ran && st.mismatches == 0 && server_mismatched == 0;
  std::printf("rdma_verify client: %s ops=%" PRIu64 " writes=%" PRIu64 " reads=%" PRIu64 " fetch_adds=%" PRIu64
              " cmp_swaps=%" PRIu64 " (swapped %" PRIu64 ") bytes_written=%" PRIu64 " bytes_read=%" PRIu64
              " mismatches=%" PRIu64 " server_mismatched_bytes=%s fences=%" PRIu64 " conflict_waits=%" PRIu64
              " elapsed_ms=%lld\n",
              ok ? "OK" : "FAILED", st.writes + st.reads + st.fetch_adds + st.cmp_swaps, st.writes, st.reads,
              st.fetch_adds, st.cmp_swaps, st.swaps_taken, st.bytes_written, st.bytes_read, st.mismatches,
              server_mismatched == UINT64_MAX ? "unknown" : std::to_string(server_mismatched).c_str(), st.fences,
              st.conflict_waits, static_cast<long long>(elapsed.count()));
  ibv_dereg_mr(mr);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<Options> o = ParseOptions(argc, argv);
  if (!o) {
    Usage();
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return o->role == "server" ? RunServer(*o) : RunClient(*o);
}
