// Access to memory a program registered. A real HCA pins a region's pages, so whatever the program does to its
// mapping afterwards (munmap, mprotect), the device's accesses land in those pages and never fault the program. uroce
// reaches registered memory through the program's own mapping, so an access to a region the program has since
// unmapped or protected would be a SIGSEGV (or SIGBUS) in the program: a remote WRITE could kill it. Every copy into
// or out of registered memory, and every atomic on it, goes through these functions instead: a fault during one is
// caught and reported (false), and the caller answers as for an access outside a valid region (a remote access
// error NAK, a local protection error completion).
//
// How: a SIGSEGV/SIGBUS handler, installed once (the first call) in front of whatever the process had, jumps back
// out of a guarded access on the thread that faulted; any other fault goes to the handler that was there before (or
// the default action), as if this one did not exist. The guarded code is a plain copy or one atomic instruction: no
// destructor is skipped by the jump.
#pragma once

#include <cstddef>
#include <cstdint>

namespace uroce::emu {

// memcpy(dst, src, n), where either side may be registered memory; false if it faulted (dst may be partly written).
bool CopyGuarded(void* dst, const void* src, size_t n);
// The 64-bit atomics of IBV_ATOMIC_HCA on registered memory: *original gets the value before; false on a fault (the
// word unchanged).
bool CompareSwapGuarded(uint64_t* target, uint64_t compare, uint64_t swap, uint64_t* original);
bool FetchAddGuarded(uint64_t* target, uint64_t add, uint64_t* original);

}  // namespace uroce::emu
