// Runs unmodified Debian RDMA programs (ibverbs-utils, perftest) against our drop-in libibverbs.so.1, for the
// integration tests in tests/clients_test.cc.
//
// A client finds our library through LD_LIBRARY_PATH (the dynamic loader searches it before the system directories,
// ld.so(8)), pointed at the Bazel runfiles copy of //verbs_api:libibverbs.so.1. Each program's stdout and stderr go to
// one file under TEST_TMPDIR, so a failing test can print everything the program said.
#ifndef UROCE_TESTS_CLIENT_RUNNER_H_
#define UROCE_TESTS_CLIENT_RUNNER_H_

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <gtest/gtest.h>
#include <memory>

#include <regex>
#include <string>
#include <utility>
#include <vector>

namespace uroce::tests {

// Extra environment variables for a child, applied over the test's own environment (a later entry wins).
using EnvOverrides = std::vector<std::pair<std::string, std::string>>;

// The directory holding our libibverbs.so.1 in the test's runfiles ($TEST_SRCDIR/uroce/verbs_api, else
// $RUNFILES_DIR/uroce/verbs_api); empty when neither holds the library.
std::string LibraryDir();

// The path of `file` (relative to the workspace, e.g. "tests/rdma_verify") in the test's runfiles
// ($TEST_SRCDIR/uroce/..., else $RUNFILES_DIR/uroce/...); empty when neither holds it. The target needs it in `data`.
std::string RunfilesPath(const std::string& file);

// The absolute path of `program` found on $PATH (or `program` itself when it contains a '/' and is executable);
// empty when it is not installed.
std::string FindProgram(const std::string& program);

// A TCP port on 127.0.0.1 that was free a moment ago: binds port 0, reads the port the kernel chose, closes.
// Returns -errno when no socket could be bound.
int FreeTcpPort();

// A 127/8 address (in 127.100.0.0-127.199.255.255, away from the automatic choices of 127.0.x.y) whose RoCE port
// nobody held a moment ago: for a device a test must name before it starts (UROCE_ADDR). Empty when 100 random
// tries found none.
std::string FreeLoopbackDeviceAddress();

// Whether some socket on this host is in the LISTEN state on TCP `port` (IPv4 or IPv6), read from /proc/net/tcp and
// /proc/net/tcp6 (proc(5)). Reading the table, unlike a probe connect(), never consumes the one connection a
// pingpong server accepts.
bool TcpPortListening(int port);

// The environment every client gets: LD_LIBRARY_PATH=LibraryDir(), and when this test binary was built with a
// sanitizer (--config=asan / tsan), LD_PRELOAD of the sanitizer runtimes our sanitized library needs, since the
// unsanitized Debian programs would not load them first. `sanitizer_note` (optional) receives a description of that.
EnvOverrides ClientEnvironment(std::string* sanitizer_note = nullptr);

struct ProcessResult {
  std::string command;   // argv joined by spaces, for messages
  int exit_code = -1;    // WEXITSTATUS when the process exited, else -1
  int term_signal = 0;   // the signal that ended it, 0 when it exited
  bool timed_out = false;  // killed by us after the timeout
  bool started = false;    // false when posix_spawn failed (see output)
  std::string output;      // stdout and stderr interleaved
  std::chrono::milliseconds elapsed{0};

  bool Succeeded() const { return started && !timed_out && term_signal == 0 && exit_code == 0; }
  // "command: exit 0 in 1234 ms" / "...: killed by signal 11" / "...: TIMED OUT after ..." plus the output.
  std::string Describe() const;
};

// A started program that a pair watches: a local child Process, or a program run elsewhere (tests/interop runs one
// side in a VM through its command shell).
class StartedProgram {
 public:
  virtual ~StartedProgram() = default;
  // false when it could not be started (Wait then says why).
  virtual bool started() const = 0;
  // Whether it has already ended; never blocks.
  virtual bool Exited() = 0;
  // Waits until it ends or `timeout` passes; on timeout kills it and marks the result timed_out.
  virtual ProcessResult Wait(std::chrono::milliseconds timeout) = 0;
  // Kills it if still running and returns its result (timed_out when it had to be killed).
  virtual ProcessResult Kill() = 0;
};

// A started child process. Move-only; the destructor kills and reaps a child still running.
class Process final : public StartedProgram {
 public:
  // Starts argv[0] (an absolute path) with `env` applied over the current environment, stdin from /dev/null and
  // stdout+stderr to a new file under $TEST_TMPDIR (else /tmp). On failure, the returned process reports started=false.
  static Process Start(const std::vector<std::string>& argv, const EnvOverrides& env);

  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) = delete;
  Process(const Process&) = delete;
  ~Process();

  bool started() const { return result_.started; }
  pid_t pid() const { return pid_; }
  // Whether the child has already ended (reaps it if so).
  bool Exited();
  // What the child has written so far (it reaches the file as the child flushes: run it under stdbuf -oL).
  std::string OutputSoFar() const;
  // Waits until the child ends or `timeout` passes; on timeout kills it with SIGKILL and marks the result timed_out.
  ProcessResult Wait(std::chrono::milliseconds timeout);
  // Kills a child still running (SIGKILL), reaps it and returns its result marked timed_out when it had to be killed.
  ProcessResult Kill();

 private:
  Process() = default;
  ProcessResult Finish();

  pid_t pid_ = -1;
  bool reaped_ = false;
  int wait_status_ = 0;
  std::string output_path_;
  std::chrono::steady_clock::time_point start_;
  ProcessResult result_;
};

// Starts, waits for (at most `timeout`) and returns one program's result.
ProcessResult RunProcess(const std::vector<std::string>& argv, const EnvOverrides& env,
                         std::chrono::milliseconds timeout);

struct PairResult {
  ProcessResult server;
  ProcessResult client;
  bool server_listened = false;  // the server's TCP handshake port was seen listening before the client started

  bool Succeeded() const { return server_listened && server.Succeeded() && client.Succeeded(); }
  std::string Describe() const;
};

// The out-of-band handshake of ibv_*_pingpong and perftest: the server listens on TCP `tcp_port`, the client
// connects to it. Starts the server, waits until the port is listening (polling TcpPortListening; gives up when the
// server ends first or `timeout` passes), then starts the client and waits for both within `timeout` overall. A
// process still running at the deadline is killed and reported timed_out; when the client fails, the server is given
// a short grace period and then killed, so a stuck server never outlives the test.
PairResult RunPair(const std::vector<std::string>& server_argv, const std::vector<std::string>& client_argv,
                   const EnvOverrides& env, int tcp_port, std::chrono::milliseconds timeout);

// The pair protocol of RunPair below for programs started anywhere: `start_server()`, poll `server_listening()` until
// true (gives up when the server ends first or `timeout` passes), `start_client()`, then watch both within `timeout`:
// once one side has exited, the other gets `grace` more if that side succeeded, 3 s if it failed.
PairResult RunStartedPair(const std::function<std::unique_ptr<StartedProgram>()>& start_server,
                          const std::function<bool()>& server_listening,
                          const std::function<std::unique_ptr<StartedProgram>()>& start_client,
                          std::chrono::milliseconds timeout,
                          std::chrono::milliseconds grace = std::chrono::milliseconds::max());

// Whether `table`, the text of /proc/net/tcp or /proc/net/tcp6 (proc(5)) read on any host, has a socket in the LISTEN
// state on local TCP `port`.
bool TcpTableListens(const std::string& table, int port);
// Whether a socket of the table, in any state, has local port `port`.
bool TcpTableUsesPort(const std::string& table, int port);

// The lines of a program's output.
std::vector<std::string> Lines(const std::string& text);
// The capture groups ([0] = the whole line) of the first line of `text` that `pattern` matches entirely; empty when
// no line does.
std::vector<std::string> MatchLine(const std::string& text, const std::regex& pattern);
bool HasLine(const std::string& text, const std::string& pattern);

// RunPair with a separate environment per side (e.g. different fault seeds). Both are watched together: once one
// side has exited, the other gets `grace` more if that side succeeded (its last SEND may still wait for an ACK the
// exited peer will never repeat), 3 s if it failed, never beyond the overall deadline.
PairResult RunPair(const std::vector<std::string>& server_argv, const EnvOverrides& server_env,
                   const std::vector<std::string>& client_argv, const EnvOverrides& client_env, int tcp_port,
                   std::chrono::milliseconds timeout,
                   std::chrono::milliseconds grace = std::chrono::milliseconds::max());

// The base of every client test: checks that our library is in the runfiles, prepares the clients' environment
// (library path, sanitizer runtimes), and finds programs and free TCP ports.
class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override;
  // The absolute path of a Debian client, or "" after recording a failure that says how to install it.
  std::string Program(const std::string& name);
  // A free TCP port for a pair's handshake (a failure is recorded when none can be had).
  int Port();

  EnvOverrides env_;
};

}  // namespace uroce::tests

#endif  // UROCE_TESTS_CLIENT_RUNNER_H_
