#include "wire/sealed_memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace uroce::wire {

int CreateSealedMemfd(const char* name, size_t bytes, void** base, int* fd) {
  const int f = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (f < 0) return -errno;
  void* mapped = MAP_FAILED;
  if (ftruncate(f, off_t(bytes)) < 0 || fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
      (mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0)) == MAP_FAILED) {
    const int err = errno;
    close(f);
    return -err;
  }
  *base = mapped;
  *fd = f;
  return 0;
}

int MapSealedMemfd(int fd, void** base, size_t* bytes) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) return errno == EINVAL ? -EINVAL : -errno;  // EINVAL: not a memfd
  if ((seals & F_SEAL_SHRINK) == 0) return -EINVAL;
  struct stat st;
  if (fstat(fd, &st) < 0) return -errno;
  if (st.st_size <= 0) return -EINVAL;
  void* mapped = mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) return -errno;
  *base = mapped;
  *bytes = size_t(st.st_size);
  return 0;
}

}  // namespace uroce::wire
