// uroce-deviced: the host's device service for one address (service/device_service.h). Started by the library when a
// process opens the host device and nobody serves its address yet; not a command users run.
//
//   uroce-deviced --address A [--every-address] [--port P] [--linger-ms N] [--daemonize]
//
// --every-address: receive on UDP 4791 of every address of the host of A's family (followed as they come and go), not
// A's alone: the device's GID table then lists them all, A at index 0.
// --daemonize: leave the starter at once (fork; the starter reaps the intermediate process), in a session of its own,
// so that the service outlives the process that started it and is nobody's child to wait for.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "service/device_service.h"

int main(int argc, char** argv) {
  std::optional<uroce::wire::IpAddress> address;
  unsigned port = uroce::wire::kRoceV2UdpPort;
  long linger_ms = 500;
  // UROCE_SERVICE_MAX_PROCESSES: the processes' library starts us with its environment, so a test (or a host that
  // wants fewer) sets it where the first process starts; --max-processes wins.
  long max_processes = uroce::wire::kMaxOwners;
  if (const char* env = std::getenv("UROCE_SERVICE_MAX_PROCESSES"); env != nullptr && *env != '\0') {
    max_processes = std::strtol(env, nullptr, 10);
  }
  bool daemonize = false, stats = false, every_address = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg == "--address" && next) {
      address = uroce::wire::IpAddress::Parse(next);
      ++i;
    } else if (arg == "--port" && next) {
      port = unsigned(std::strtoul(next, nullptr, 10));
      ++i;
    } else if (arg == "--linger-ms" && next) {
      linger_ms = std::strtol(next, nullptr, 10);
      ++i;
    } else if (arg == "--max-processes" && next) {
      max_processes = std::strtol(next, nullptr, 10);
      ++i;
    } else if (arg == "--every-address") {
      every_address = true;
    } else if (arg == "--daemonize") {
      daemonize = true;
    } else if (arg == "--stats") {
      stats = true;
    } else {
      fprintf(stderr, "uroce-deviced: unknown argument '%s'\n", arg.c_str());
      return 2;
    }
  }
  if (!address || port == 0 || port > 65535 || linger_ms < 0 || max_processes < 1 ||
      max_processes > long(uroce::wire::kMaxOwners)) {
    fprintf(stderr,
            "usage: uroce-deviced --address A [--every-address] [--port P] [--linger-ms N] [--max-processes 1..255] "
            "[--daemonize] [--stats]\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  // Each process that joins costs us several descriptors (its connection, forward socket, doorbell, steered socket),
  // and our soft limit of open files is the starter's by inheritance, not a choice of ours: under a starter's
  // `ulimit -Sn 64` the tenth join failed ("did not answer", EPROTO). Take the hard one, as servers do.
  if (rlimit files; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  if (daemonize) {
    const pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid > 0) _exit(0);
    setsid();
  }
  boost::asio::io_context io;
  uroce::service::DeviceService service(io, *address, uint16_t(port), std::chrono::milliseconds(linger_ms),
                                        unsigned(max_processes), every_address);
  const int rc = service.Start();
  if (rc == -EADDRINUSE) return 0;  // another service won the race for this address: it serves
  if (rc < 0) {
    fprintf(stderr, "uroce-deviced: %s: %s\n", address->ToString().c_str(), strerror(-rc));
    return 1;
  }
  service.Run();
  if (stats) fputs(service.CountersText().c_str(), stderr);
  return 0;
}
