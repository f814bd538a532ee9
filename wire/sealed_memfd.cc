#include "wire/sealed_memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace uroce::wire {

int CreateSealedMemfd(const char* name, size_t bytes, void** base, int* fd, int extra_seals) {
  const int f = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (f < 0) return -errno;
  void* mapped = MAP_FAILED;
  // Mapped before the seals: F_SEAL_FUTURE_WRITE refuses writable mappings made after it.
  if (ftruncate(f, off_t(bytes)) < 0 ||
      (mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0)) == MAP_FAILED ||
      fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | extra_seals) < 0) {
    const int err = errno;
    if (mapped != MAP_FAILED) munmap(mapped, bytes);
    close(f);
    return -err;
  }
  *base = mapped;
  *fd = f;
  return 0;
}

int MapSealedMemfd(int fd, void** base, size_t* bytes, bool writable) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) return errno == EINVAL ? -EINVAL : -errno;  // EINVAL: not a memfd
  if ((seals & F_SEAL_SHRINK) == 0) return -EINVAL;
  struct stat st;
  if (fstat(fd, &st) < 0) return -errno;
  if (st.st_size <= 0) return -EINVAL;
  void* mapped = mmap(nullptr, size_t(st.st_size), writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) return -errno;
  *base = mapped;
  *bytes = size_t(st.st_size);
  return 0;
}

}  // namespace uroce::wire
