// The other process of //rdmacm:rsocket_test's two-process cases: connects a stream rsocket to 127.0.0.1:PORT, then
//   die PORT BYTES    sends BYTES pattern bytes (i % 251), waits for one byte back (the test has read them all) and
//                     kills itself with SIGKILL: no rclose, no end of stream, only its process's death to notice;
//   iomap PORT BYTES  riomaps a buffer of BYTES at offset 0, sends one byte (behind the map's announcement), waits
//                     for one byte (behind the test's riowrite) and exits 0 if the buffer holds the pattern
//                     (i % 251), 3 if not.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

int Fail(const char* what) {
  std::perror(what);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || (std::strcmp(argv[1], "die") != 0 && std::strcmp(argv[1], "iomap") != 0)) {
    std::fprintf(stderr, "usage: %s die|iomap PORT BYTES\n", argv[0]);
    return 2;
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(uint16_t(std::atoi(argv[2])));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || rconnect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) return Fail("rconnect");
  std::vector<unsigned char> data(size_t(std::atol(argv[3])));
  char byte = 0;
  if (std::strcmp(argv[1], "die") == 0) {
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i % 251);
    if (rsend(fd, data.data(), data.size(), 0) != ssize_t(data.size())) return Fail("rsend");
    if (rrecv(fd, &byte, 1, 0) != 1) return Fail("rrecv");
    kill(getpid(), SIGKILL);
    return 1;
  }
  if (riomap(fd, data.data(), data.size(), PROT_WRITE, 0, 0) != 0) return Fail("riomap");
  if (rsend(fd, "m", 1, 0) != 1) return Fail("rsend");
  if (rrecv(fd, &byte, 1, 0) != 1) return Fail("rrecv");
  for (size_t i = 0; i < data.size(); ++i)
    if (data[i] != static_cast<unsigned char>(i % 251)) return 3;
  riounmap(fd, data.data(), data.size());
  rclose(fd);
  return 0;
}
