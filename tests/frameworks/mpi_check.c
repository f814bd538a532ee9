// An MPI job's own checks, for tests/frameworks: a ping-pong of 64 KiB messages between ranks 0 and 1 (each byte
// checked after the round trip), an allreduce and an alltoall whose results every rank checks. Rank 0 prints
// "ranks N errors E"; the exit status is 0 only when no rank found an error.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { kMessage = 65536, kRounds = 100, kPerPeer = 1000 };

static unsigned char Byte(int i, int round) { return (unsigned char)(i * 7 + round); }

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int errors = 0;
  static unsigned char buf[kMessage];
  for (int round = 0; round < kRounds; ++round) {
    if (rank == 0) {
      for (int i = 0; i < kMessage; ++i) buf[i] = Byte(i, round);
      MPI_Send(buf, kMessage, MPI_BYTE, 1, round, MPI_COMM_WORLD);
      MPI_Recv(buf, kMessage, MPI_BYTE, 1, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      for (int i = 0; i < kMessage; ++i) {
        if (buf[i] != (unsigned char)(Byte(i, round) + 1)) {
          ++errors;
          break;
        }
      }
    } else if (rank == 1) {
      MPI_Recv(buf, kMessage, MPI_BYTE, 0, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      for (int i = 0; i < kMessage; ++i) buf[i] += 1;  // the echo is changed, so an unanswered buffer cannot pass
      MPI_Send(buf, kMessage, MPI_BYTE, 0, round, MPI_COMM_WORLD);
    }
  }
  long mine = rank + 1, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (sum != (long)size * (size + 1) / 2) ++errors;
  int* out = malloc(sizeof(int) * size * kPerPeer);
  int* in = malloc(sizeof(int) * size * kPerPeer);
  for (int peer = 0; peer < size; ++peer)
    for (int k = 0; k < kPerPeer; ++k) out[peer * kPerPeer + k] = rank * 1000000 + peer * kPerPeer + k;
  MPI_Alltoall(out, kPerPeer, MPI_INT, in, kPerPeer, MPI_INT, MPI_COMM_WORLD);
  for (int from = 0; from < size; ++from) {
    for (int k = 0; k < kPerPeer; ++k) {
      if (in[from * kPerPeer + k] != from * 1000000 + rank * kPerPeer + k) {
        ++errors;
        from = size;
        break;
      }
    }
  }
  int total = 0;
  MPI_Reduce(&errors, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("ranks %d errors %d\n", size, total);
  free(out);
  free(in);
  MPI_Finalize();
  return total != 0 || errors != 0;
}
