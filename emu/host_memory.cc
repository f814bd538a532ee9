#include "emu/host_memory.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace uroce::emu {
#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer runs a program's SIGSEGV handler later, from its own (not at the faulting instruction), so the jump
// back cannot work there. Its builds copy through the kernel instead, which answers EFAULT for a bad range: a system
// call per copy, slower, for a sanitizer build only. An atomic first reads its word the same way.
bool CopyGuarded(void* dst, const void* src, size_t n) {
  if (n == 0) return true;
  iovec local{dst, n}, remote{const_cast<void*>(src), n};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == ssize_t(n);
}

static bool Readable(const uint64_t* word) {
  uint64_t copy;
  return CopyGuarded(&copy, word, sizeof copy);
}

bool CompareSwapGuarded(uint64_t* target, uint64_t compare, uint64_t swap, uint64_t* original) {
  if (!Readable(target)) return false;
  uint64_t expected = compare;
  __atomic_compare_exchange_n(target, &expected, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  *original = expected;
  return true;
}

bool FetchAddGuarded(uint64_t* target, uint64_t add, uint64_t* original) {
  if (!Readable(target)) return false;
  *original = __atomic_fetch_add(target, add, __ATOMIC_SEQ_CST);
  return true;
}
#else
namespace {

// The thread's way back out of a guarded access (nullptr: none in progress).
thread_local sigjmp_buf* t_recover = nullptr;

struct sigaction g_previous_segv, g_previous_bus;

void Forward(int sig, siginfo_t* info, void* context) {
  const struct sigaction& previous = sig == SIGBUS ? g_previous_bus : g_previous_segv;
  if (previous.sa_flags & SA_SIGINFO) {
    previous.sa_sigaction(sig, info, context);
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
  } else {
    // The default action: back to it, and the faulting instruction runs again and faults as if we were not here.
    signal(sig, SIG_DFL);
  }
}

void OnFault(int sig, siginfo_t* info, void* context) {
  if (sigjmp_buf* recover = t_recover) {
    t_recover = nullptr;
    siglongjmp(*recover, 1);
  }
  Forward(sig, info, context);
}

void InstallOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction a {};
    a.sa_sigaction = OnFault;
    // SA_NODEFER: the jump out leaves the handler without sigreturn, so the signal must not stay blocked.
    a.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&a.sa_mask);
    sigaction(SIGSEGV, &a, &g_previous_segv);
    sigaction(SIGBUS, &a, &g_previous_bus);
  });
}

// Runs `access` (a copy or one atomic: nothing that owns resources) with faults caught; false if one happened.
template <typename Access>
bool Guarded(Access access) {
  InstallOnce();
  sigjmp_buf recover;
  if (sigsetjmp(recover, 0) != 0) return false;  // came back from OnFault
  // The fences keep the compiler from dropping the first store (nothing it can see reads t_recover before the second)
  // or moving the access out from between them: the signal handler is the reader it cannot see.
  t_recover = &recover;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  access();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_recover = nullptr;
  return true;
}

}  // namespace

bool CopyGuarded(void* dst, const void* src, size_t n) {
  if (n == 0) return true;
  return Guarded([&] { std::memcpy(dst, src, n); });
}

bool CompareSwapGuarded(uint64_t* target, uint64_t compare, uint64_t swap, uint64_t* original) {
  return Guarded([&] {
    uint64_t expected = compare;
    __atomic_compare_exchange_n(target, &expected, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    *original = expected;
  });
}

bool FetchAddGuarded(uint64_t* target, uint64_t add, uint64_t* original) {
  return Guarded([&] { *original = __atomic_fetch_add(target, add, __ATOMIC_SEQ_CST); });
}

#endif

}  // namespace uroce::emu
