// uroce_open_bench N: N processes open uroce0 at once and hold it open, as N test programs of a CI job might.
// Prints how long until every one had the device open, how many distinct addresses (GID 0) they got, and how many
// failed or crashed; exits 0 only when all N opened the device on distinct addresses and none crashed.
//
// Links the system libibverbs like any client; run it with LD_LIBRARY_PATH pointing at ours (`tools/uroce bench open
// N` does). The parent forks the N children at once and never opens the device itself; each child opens it, reports
// over a pipe, and holds it until the parent closes the release pipe, so all N are open at the same time.
#include <infiniband/verbs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

struct Report {
  int error = 0;          // errno of a failed ibv_open_device / ibv_query_gid, 0 on success
  uint8_t gid[16] = {};   // GID 0: the IPv4-mapped address the device bound
  int64_t open_us = 0;    // time ibv_open_device took in this process
};

using Clock = std::chrono::steady_clock;

[[noreturn]] void Child(int report_fd, int release_fd) {
  Report r;
  const auto t0 = Clock::now();
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  ibv_context* ctx = list && num > 0 ? ibv_open_device(list[0]) : nullptr;
  r.open_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
  ibv_gid gid{};
  if (!ctx) {
    r.error = errno ? errno : ENODEV;
  } else if (ibv_query_gid(ctx, 1, 0, &gid) != 0) {
    r.error = errno ? errno : EIO;
  } else {
    std::memcpy(r.gid, gid.raw, 16);
  }
  if (write(report_fd, &r, sizeof r) != ssize_t(sizeof r)) _exit(3);
  char c;
  while (read(release_fd, &c, 1) < 0 && errno == EINTR) {
  }
  if (ctx) ibv_close_device(ctx);
  if (list) ibv_free_device_list(list);
  _exit(r.error ? 1 : 0);
}

std::string GidText(const uint8_t gid[16]) {
  char buf[INET6_ADDRSTRLEN] = {};
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(gid, kMapped, 12) == 0) {
    inet_ntop(AF_INET, gid + 12, buf, sizeof buf);
  } else {
    inet_ntop(AF_INET6, gid, buf, sizeof buf);
  }
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 0;
  if (n <= 0) {
    std::fprintf(stderr, "usage: uroce_open_bench N   (N processes open uroce0 at once)\n");
    return 2;
  }
  int report[2], release[2];
  if (pipe(report) != 0 || pipe(release) != 0) {
    std::perror("pipe");
    return 2;
  }
  std::fflush(nullptr);
  const auto t0 = Clock::now();
  std::vector<pid_t> children;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "fork #%d: %s\n", i, std::strerror(errno));
      break;
    }
    if (pid == 0) {
      close(report[0]);
      close(release[1]);
      Child(report[1], release[0]);
    }
    children.push_back(pid);
  }
  close(report[1]);
  close(release[0]);
  std::vector<Report> reports;
  Report r;
  // Reports are smaller than PIPE_BUF, so each arrives whole (pipe(7)). EOF: every child reported or died.
  while (reports.size() < children.size()) {
    const ssize_t got = read(report[0], &r, sizeof r);
    if (got == ssize_t(sizeof r)) {
      reports.push_back(r);
    } else if (got == 0 || (got < 0 && errno != EINTR)) {
      break;
    }
  }
  const double all_open_s = std::chrono::duration<double>(Clock::now() - t0).count();
  close(release[1]);  // let them close the device and exit
  int crashed = 0, exited_nonzero = 0;
  for (pid_t pid : children) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(status)) ++crashed;
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0) ++exited_nonzero;
  }
  int opened = 0;
  int64_t max_open_us = 0, sum_open_us = 0;
  std::set<std::string> addresses;
  std::set<int> errors;
  for (const Report& each : reports) {
    if (each.error) {
      errors.insert(each.error);
      continue;
    }
    ++opened;
    max_open_us = std::max(max_open_us, each.open_us);
    sum_open_us += each.open_us;
    addresses.insert(GidText(each.gid));
  }
  std::printf("%d processes: %d opened uroce0 in %.3f s (all open at once; ibv_open_device mean %.2f ms, max %.2f ms), "
              "%zu distinct addresses, %d failed, %d crashed\n",
              n, opened, all_open_s, opened ? double(sum_open_us) / opened / 1000 : 0.0, double(max_open_us) / 1000,
              addresses.size(), n - opened, crashed);
  for (int e : errors) std::printf("  failure: %s\n", std::strerror(e));
  const bool ok = opened == n && int(addresses.size()) == n && crashed == 0 && exited_nonzero == 0;
  return ok ? 0 : 1;
}
