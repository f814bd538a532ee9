#include "wire/event_fd.h"

#include <unistd.h>

#include <cstdint>

namespace uroce::wire {

void DrainEventFd(int fd) {
  uint64_t v;
  while (read(fd, &v, sizeof v) == sizeof v) {
  }
}

void SignalEventFd(int fd) {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t r = write(fd, &one, sizeof one);
}

}  // namespace uroce::wire
