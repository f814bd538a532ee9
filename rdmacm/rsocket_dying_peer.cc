// A stream rsocket peer that dies without a word, for //rdmacm:rsocket_test: connects to 127.0.0.1:PORT, sends
// BYTES pattern bytes (i % 251), waits for one byte back (the test has read them all), then kills itself with SIGKILL
// -- no rclose, no end of stream, no disconnect: only its process's death is there to be noticed.
//
// usage: rsocket_dying_peer PORT BYTES
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s PORT BYTES\n", argv[0]);
    return 2;
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(uint16_t(std::atoi(argv[1])));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || rconnect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    std::perror("rsocket_dying_peer: rconnect");
    return 1;
  }
  std::vector<unsigned char> data(size_t(std::atol(argv[2])));
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i % 251);
  if (rsend(fd, data.data(), data.size(), 0) != ssize_t(data.size())) {
    std::perror("rsocket_dying_peer: rsend");
    return 1;
  }
  char ack;
  if (rrecv(fd, &ack, 1, 0) != 1) {
    std::perror("rsocket_dying_peer: rrecv");
    return 1;
  }
  kill(getpid(), SIGKILL);
  return 1;
}
