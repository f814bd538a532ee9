// Makes this process (and what it execs) see io_uring as a container's default seccomp profile shows it: every
// io_uring_setup(2) fails with `error` (Docker >= 25 and containerd 2.0 answer EPERM). Irreversible for the process.
#ifndef UROCE_TESTS_DENY_IO_URING_H_
#define UROCE_TESTS_DENY_IO_URING_H_

namespace uroce::tests {

// prctl(PR_SET_NO_NEW_PRIVS) (so an unprivileged process may install a filter) and a seccomp BPF filter
// (seccomp(2), PR_SET_SECCOMP with SECCOMP_MODE_FILTER) that answers io_uring_setup with -`error` and allows every
// other system call. Returns 0 or an errno.
int DenyIoUringSetup(int error);

}  // namespace uroce::tests

#endif  // UROCE_TESTS_DENY_IO_URING_H_
