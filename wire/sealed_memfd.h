// Shared memory one process of the host makes and hands to another (SCM_RIGHTS): a memfd sealed against shrinking
// and growing, since whoever holds a descriptor of an unsealed one could cut it under the other's mapping, and the
// next access there would kill that process with SIGBUS (memfd_create(2), "file sealing"). The packet rings
// (wire/packet_ring.h) and the direct-access tables (wire/direct_access.h) are such files.
//
// Error contract (as liburing's): 0 on success, -errno on failure.
#pragma once

#include <cstddef>

namespace uroce::wire {

// A new memfd of `bytes` (zeroed), sealed, mapped read-write: the mapping in *base, the descriptor (close-on-exec, the
// caller's to pass and close) in *fd. `extra_seals` are added to the size's (F_SEAL_FUTURE_WRITE: only this mapping
// may write; whoever is handed the file can map it read-only). -errno of memfd_create, ftruncate, fcntl or mmap.
int CreateSealedMemfd(const char* name, size_t bytes, void** base, int* fd, int extra_seals = 0);
// Maps the memfd `fd` another process made (not taken: the caller closes it), read-write or read-only, only if it is
// sealed against shrinking: the mapping in *base, its size in *bytes. -EINVAL when it is not a memfd or not so sealed;
// -errno of fstat or mmap.
int MapSealedMemfd(int fd, void** base, size_t* bytes, bool writable = true);

}  // namespace uroce::wire
