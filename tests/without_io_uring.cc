// without_io_uring [--enosys] PROGRAM [ARG...]: runs PROGRAM where io_uring_setup(2) fails with EPERM (as under the
// default seccomp profile of Docker >= 25 and containerd 2.0) or, with --enosys, ENOSYS (a kernel without
// CONFIG_IO_URING, gVisor). The filter is installed before exec and inherited by PROGRAM and its children.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tests/deny_io_uring.h"

int main(int argc, char** argv) {
  int first = 1;
  int error = EPERM;
  if (argc > 1 && std::strcmp(argv[1], "--enosys") == 0) {
    error = ENOSYS;
    ++first;
  }
  if (first >= argc) {
    std::fprintf(stderr, "usage: without_io_uring [--enosys] PROGRAM [ARG...]\n");
    return 2;
  }
  if (int err = uroce::tests::DenyIoUringSetup(error)) {
    std::fprintf(stderr, "without_io_uring: cannot install the seccomp filter: %s\n", std::strerror(err));
    return 2;
  }
  execvp(argv[first], argv + first);
  std::fprintf(stderr, "without_io_uring: cannot run %s: %s\n", argv[first], std::strerror(errno));
  return 127;
}
