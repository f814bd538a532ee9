#include "tests/client_runner.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <link.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <iostream>
#include <sstream>
#include <thread>

extern char** environ;

namespace uroce::tests {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

bool IsReadableFile(const std::string& path) { return ::access(path.c_str(), R_OK) == 0; }

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr && dir[0] != '\0' ? dir : "/tmp";
}

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string JoinArgv(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& arg : argv) {
    if (!out.empty()) out += ' ';
    out += arg;
  }
  return out;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The loaded sanitizer runtimes of this process (libasan first: ASan insists on being the first DSO initialised),
// found by walking the link map (dl_iterate_phdr(3)).
std::vector<std::string> LoadedSanitizerRuntimes() {
  struct Found {
    std::string asan, others;
  } found;
  ::dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) -> int {
        auto* f = static_cast<Found*>(data);
        if (info->dlpi_name == nullptr || info->dlpi_name[0] != '/') return 0;
        const std::string name = Basename(info->dlpi_name);
        if (name.rfind("libasan.so", 0) == 0) {
          f->asan = info->dlpi_name;
        } else if (name.rfind("libtsan.so", 0) == 0 || name.rfind("libubsan.so", 0) == 0 ||
                   name.rfind("liblsan.so", 0) == 0) {
          f->others += (f->others.empty() ? "" : ":") + std::string(info->dlpi_name);
        }
        return 0;
      },
      &found);
  std::vector<std::string> out;
  if (!found.asan.empty()) out.push_back(found.asan);
  if (!found.others.empty()) {
    std::stringstream ss(found.others);
    std::string item;
    while (std::getline(ss, item, ':')) out.push_back(item);
  }
  return out;
}

std::atomic<int> g_log_counter{0};

}  // namespace

std::string RunfilesPath(const std::string& file) {
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    const char* root = std::getenv(var);
    if (root == nullptr || root[0] == '\0') continue;
    const std::string path = std::string(root) + "/uroce/" + file;
    if (IsReadableFile(path)) return path;
  }
  return "";
}

std::string LibraryDir() {
  const std::string library = RunfilesPath("verbs_api/libibverbs.so.1");
  return library.empty() ? "" : library.substr(0, library.rfind('/'));
}

std::string FindProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) return IsExecutableFile(program) ? program : "";
  const char* path_env = std::getenv("PATH");
  std::string path = path_env != nullptr && path_env[0] != '\0' ? path_env : "/usr/local/bin:/usr/bin:/bin";
  // Bazel's test PATH may be minimal; Debian installs the clients in /usr/bin.
  path += ":/usr/bin:/bin";
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/" + program;
    if (IsExecutableFile(candidate)) return candidate;
  }
  return "";
}

int FreeTcpPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return -err;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string FreeLoopbackDeviceAddress() {
  std::random_device random;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const uint32_t host = 0x7f000000u | (100u + random() % 100u) << 16 | (random() % 250u + 1) << 8 | (random() % 250u + 1);
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_port = htons(4791);
    in.sin_addr.s_addr = htonl(host);
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    const bool free = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&in), sizeof in) == 0;
    if (fd >= 0) ::close(fd);
    if (free) {
      char text[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
      return text;
    }
  }
  return "";
}

namespace {

// Whether a line of a /proc/net/tcp table has local port `port`, in `state` unless that is empty.
bool TcpTableHas(const std::string& table, int port, const std::string& state) {
  std::istringstream in(table);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, line_state;
    if (!(fields >> slot >> local >> remote >> line_state)) continue;  // also skips the header: its 4th word is no state
    const size_t colon = local.rfind(':');
    if (colon == std::string::npos) continue;
    char* end = nullptr;
    const long local_port = std::strtol(local.c_str() + colon + 1, &end, 16);
    if (end == local.c_str() + colon + 1) continue;
    if (local_port == port && (state.empty() || line_state == state)) return true;
  }
  return false;
}

}  // namespace

// LISTEN is state 0A (include/net/tcp_states.h).
bool TcpTableListens(const std::string& table, int port) { return TcpTableHas(table, port, "0A"); }

bool TcpTableUsesPort(const std::string& table, int port) { return TcpTableHas(table, port, ""); }

bool TcpPortListening(int port) {
  return TcpTableListens(ReadWholeFile("/proc/net/tcp"), port) || TcpTableListens(ReadWholeFile("/proc/net/tcp6"), port);
}

EnvOverrides ClientEnvironment(std::string* sanitizer_note) {
  EnvOverrides env;
  env.emplace_back("LD_LIBRARY_PATH", LibraryDir());
  // Our sanitized library (--config=asan / tsan) has DT_NEEDED on the sanitizer runtimes, which must be initialised
  // before any other library; an unsanitized program only gets that when they are preloaded (the same arrangement as
  // verbs_api/abi_symbols_test.sh). This test binary was built with the same flags, so its own link map names them.
  const std::vector<std::string> runtimes = LoadedSanitizerRuntimes();
  if (!runtimes.empty()) {
    std::string preload;
    for (const std::string& r : runtimes) preload += (preload.empty() ? "" : ":") + r;
    env.emplace_back("LD_PRELOAD", preload);
    // The Debian programs never free everything before exit; their leaks are not ours to judge.
    const char* asan = std::getenv("ASAN_OPTIONS");
    env.emplace_back("ASAN_OPTIONS", std::string(asan != nullptr && asan[0] != '\0' ? std::string(asan) + ":" : "") +
                                         "detect_leaks=0");
    if (sanitizer_note != nullptr) *sanitizer_note = "clients run with LD_PRELOAD=" + preload;
  }
  return env;
}

std::string ProcessResult::Describe() const {
  std::ostringstream out;
  out << command << ": ";
  if (!started) {
    out << "did not start";
  } else if (timed_out) {
    out << "TIMED OUT after " << elapsed.count() << " ms (killed)";
  } else if (term_signal != 0) {
    out << "killed by signal " << term_signal << " (" << ::strsignal(term_signal) << ") after " << elapsed.count()
        << " ms";
  } else {
    out << "exit " << exit_code << " in " << elapsed.count() << " ms";
  }
  constexpr size_t kMaxOutput = 16 * 1024;
  out << "\n----- output -----\n";
  if (output.size() > kMaxOutput) {
    out << "[... " << output.size() - kMaxOutput << " bytes cut ...]\n" << output.substr(output.size() - kMaxOutput);
  } else {
    out << output;
  }
  out << "------------------\n";
  return out.str();
}

std::string PairResult::Describe() const {
  std::ostringstream out;
  if (!server_listened) out << "The server never listened on its TCP port; the client was not started.\n";
  out << "[server] " << server.Describe() << "[client] " << client.Describe();
  return out.str();
}

Process Process::Start(const std::vector<std::string>& argv, const EnvOverrides& env) {
  Process p;
  p.result_.command = JoinArgv(argv);
  p.output_path_ = TempDir() + "/" + (argv.empty() ? "empty" : Basename(argv[0])) + "." +
                   std::to_string(::getpid()) + "." + std::to_string(g_log_counter++) + ".log";
  p.start_ = Clock::now();
  if (argv.empty()) {
    p.result_.output = "empty argv";
    return p;
  }

  // Everything the child needs is built before fork(): after it, the child only makes async-signal-safe calls.
  std::map<std::string, std::string> merged;
  std::vector<std::string> order;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = entry.substr(0, eq);
    if (merged.emplace(key, entry.substr(eq + 1)).second) order.push_back(key);
  }
  for (const auto& [key, value] : env) {
    if (merged.find(key) == merged.end()) order.push_back(key);
    merged[key] = value;
  }
  std::vector<std::string> env_strings;
  env_strings.reserve(order.size());
  for (const std::string& key : order) env_strings.push_back(key + "=" + merged[key]);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  std::vector<char*> argvp;
  for (std::string& s : argv_copy) argvp.push_back(s.data());
  argvp.push_back(nullptr);

  const int out_fd = ::open(p.output_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0) {
    p.result_.output = "cannot create " + p.output_path_ + ": " + std::strerror(errno);
    return p;
  }
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // exec failure is reported through a close-on-exec pipe: EOF means exec succeeded.
  int status_pipe[2];
  if (null_fd < 0 || ::pipe2(status_pipe, O_CLOEXEC) != 0) {
    p.result_.output = std::string("cannot set up the child: ") + std::strerror(errno);
    ::close(out_fd);
    if (null_fd >= 0) ::close(null_fd);
    return p;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // A child must not outlive a test binary that crashed or was killed by Bazel's timeout.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(out_fd, STDERR_FILENO);
    ::execve(argvp[0], argvp.data(), envp.data());
    const int err = errno;
    (void)!::write(status_pipe[1], &err, sizeof(err));
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(status_pipe[1]);
  ::close(out_fd);
  ::close(null_fd);
  if (pid < 0) {
    ::close(status_pipe[0]);
    p.result_.output = std::string("fork: ") + std::strerror(fork_errno);
    return p;
  }
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(status_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  ::close(status_pipe[0]);
  p.pid_ = pid;
  if (n == sizeof(exec_errno)) {
    ::waitpid(pid, &p.wait_status_, 0);
    p.reaped_ = true;
    p.result_.output = "execve " + argv[0] + ": " + std::strerror(exec_errno);
    return p;
  }
  p.result_.started = true;
  return p;
}

Process::Process(Process&& other) noexcept
    : pid_(other.pid_),
      reaped_(other.reaped_),
      wait_status_(other.wait_status_),
      output_path_(std::move(other.output_path_)),
      start_(other.start_),
      result_(std::move(other.result_)) {
  other.pid_ = -1;
  other.reaped_ = true;
}

Process::~Process() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &wait_status_, 0);
  }
}

std::string Process::OutputSoFar() const { return ReadWholeFile(output_path_); }

bool Process::Exited() {
  if (pid_ <= 0 || reaped_) return true;
  pid_t r;
  do {
    r = ::waitpid(pid_, &wait_status_, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_ || r < 0) reaped_ = true;
  return reaped_;
}

ProcessResult Process::Wait(milliseconds timeout) {
  if (!result_.started) return Finish();
  const Clock::time_point deadline = Clock::now() + timeout;
#ifdef SYS_pidfd_open
  // A pidfd becomes readable when the process ends (pidfd_open(2)): wait on it instead of polling waitpid.
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
#else
  const int pidfd = -1;
#endif
  while (!Exited()) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      if (pidfd >= 0) ::close(pidfd);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &wait_status_, 0);
      reaped_ = true;
      result_.timed_out = true;
      return Finish();
    }
    if (pidfd >= 0) {
      pollfd pfd{pidfd, POLLIN, 0};
      ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    } else {
      std::this_thread::sleep_for(std::min(left, milliseconds(2)));
    }
  }
  if (pidfd >= 0) ::close(pidfd);
  return Finish();
}

ProcessResult Process::Kill() {
  if (result_.started && !Exited()) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &wait_status_, 0);
    reaped_ = true;
    result_.timed_out = true;
  }
  return Finish();
}

ProcessResult Process::Finish() {
  ProcessResult r = result_;
  if (r.started) {
    r.elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start_);
    if (WIFEXITED(wait_status_)) {
      r.exit_code = WEXITSTATUS(wait_status_);
    } else if (WIFSIGNALED(wait_status_)) {
      r.term_signal = WTERMSIG(wait_status_);
      // Our own SIGKILL on timeout is reported as the timeout, not as a crash.
      if (r.timed_out && r.term_signal == SIGKILL) r.term_signal = 0;
    }
    r.output = ReadWholeFile(output_path_);
  }
  return r;
}

ProcessResult RunProcess(const std::vector<std::string>& argv, const EnvOverrides& env, milliseconds timeout) {
  Process p = Process::Start(argv, env);
  return p.Wait(timeout);
}

PairResult RunPair(const std::vector<std::string>& server_argv, const std::vector<std::string>& client_argv,
                   const EnvOverrides& env, int tcp_port, milliseconds timeout) {
  return RunPair(server_argv, env, client_argv, env, tcp_port, timeout);
}

PairResult RunPair(const std::vector<std::string>& server_argv, const EnvOverrides& server_env,
                   const std::vector<std::string>& client_argv, const EnvOverrides& client_env, int tcp_port,
                   milliseconds timeout, milliseconds grace) {
  // The server opens the device, creates its QP and only then listens; poll the kernel's socket table for it.
  return RunStartedPair([&] { return std::make_unique<Process>(Process::Start(server_argv, server_env)); },
                        [&] { return TcpPortListening(tcp_port); },
                        [&] { return std::make_unique<Process>(Process::Start(client_argv, client_env)); }, timeout,
                        grace);
}

PairResult RunStartedPair(const std::function<std::unique_ptr<StartedProgram>()>& start_server,
                          const std::function<bool()>& server_listening,
                          const std::function<std::unique_ptr<StartedProgram>()>& start_client, milliseconds timeout,
                          milliseconds grace) {
  PairResult result;
  const Clock::time_point deadline = Clock::now() + timeout;
  const auto left = [&] {
    return std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  };
  std::unique_ptr<StartedProgram> server = start_server();
  if (!server->started()) {
    result.server = server->Wait(milliseconds(0));
    return result;
  }
  while (!(result.server_listened = server_listening())) {
    if (server->Exited() || left().count() == 0) break;
    std::this_thread::sleep_for(milliseconds(5));
  }
  if (!result.server_listened) {
    result.server = server->Kill();
    return result;
  }
  std::unique_ptr<StartedProgram> client = start_client();
  while (!server->Exited() && !client->Exited() && left().count() > 0) std::this_thread::sleep_for(milliseconds(5));
  // Whichever ended first is collected at once; the other gets its budget (after a failure, the survivor may wait
  // forever for a peer that is gone: a short grace period only).
  const bool client_first = client->Exited();
  ProcessResult& first = client_first ? result.client : result.server;
  ProcessResult& second = client_first ? result.server : result.client;
  first = (client_first ? client : server)->Wait(milliseconds(0));
  const milliseconds budget = first.Succeeded() ? std::min(left(), grace) : std::min(left(), milliseconds(3000));
  second = (client_first ? server : client)->Wait(budget);
  return result;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::vector<std::string> MatchLine(const std::string& text, const std::regex& pattern) {
  for (const std::string& line : Lines(text)) {
    std::smatch m;
    if (std::regex_match(line, m, pattern)) {
      std::vector<std::string> groups;
      for (const auto& g : m) groups.push_back(g.str());
      return groups;
    }
  }
  return {};
}

bool HasLine(const std::string& text, const std::string& pattern) {
  return !MatchLine(text, std::regex(pattern)).empty();
}

void ClientTest::SetUp() {
  ASSERT_FALSE(LibraryDir().empty())
      << "our libibverbs.so.1 is not in the runfiles ($TEST_SRCDIR/uroce/verbs_api); the target needs "
         "data = [\"//verbs_api:libibverbs.so.1\"]";
  std::string note;
  env_ = ClientEnvironment(&note);
  static bool noted = false;
  if (!note.empty() && !noted) {
    std::cerr << note << "\n";
    noted = true;
  }
}

std::string ClientTest::Program(const std::string& name) {
  const std::string path = FindProgram(name);
  if (path.empty()) {
    ADD_FAILURE() << name << " is not installed: run `tools/uroce setup` (installs ibverbs-utils and perftest)";
  }
  return path;
}

int ClientTest::Port() {
  const int port = FreeTcpPort();
  EXPECT_GT(port, 0) << "FreeTcpPort: " << port;
  return port;
}

}  // namespace uroce::tests
