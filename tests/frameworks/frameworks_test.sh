#!/usr/bin/env bash
# The RDMA frameworks most software reaches verbs through, unmodified (Debian 12's packages, installed by
# `tools/uroce setup`), run over uroce through `uroce run` (the installed launcher, assembled from this test's runfiles
# as `tools/uroce install` lays it out) with nothing else set but each framework's own device and transport selection:
#
#   UCX 1.13      ucx_info -d lists uroce0 with rc_verbs and ud_verbs; ucx_perftest tag_bw, tag_lat, ucp_put_bw and
#                 ucp_get pairs over UCX_TLS=rc_verbs,ud_verbs and over ud_verbs alone, and under 1% loss;
#   Open MPI 4.1  (pml ucx) and MPICH 4.0 (ch4:ucx), -np 2 and -np 4: mpi_check.c's ping-pong, allreduce and alltoall,
#                 results checked, with UCX_TLS=self,rc_verbs,ud_verbs (no shared memory, no TCP) and every rank's
#                 counters showing its packets;
#   librpma 1.2   rpma_check: read, write, flush and send/receive, bytes checked;
#   libfabric 1.17 (root only: a network namespace of the test's own, since the verbs provider offers MSG and RDM
#                 endpoints only on non-loopback interfaces) fi_info -p verbs lists MSG and verbs;ofi_rxm RDM
#                 endpoints; fi_pingpong dgram, msg and rdm pairs; Open MPI --mca pml cm --mca mtl ofi over
#                 verbs;ofi_rxm, -np 4. Each process takes its own address with --addr 10.77.0.0/24.
#
# One JUnit case each (tests/junit.bash); UROCE_TRANSPORT (the BUILD's env) chooses the transport for all of them.
# usage (by Bazel): frameworks_test.sh     (--in-namespace: the part that runs inside the network namespace)
set -uo pipefail

# shellcheck source=tests/junit.bash
source tests/junit.bash
# shellcheck source=tools/uroce.bash
source tools/uroce.bash

WORK="${TEST_TMPDIR:-$(mktemp -d)}/frameworks"
PREFIX="$WORK/prefix"
UROCE="$PREFIX/bin/uroce"  # the installed launcher
TIMEOUT=120

# The installed layout `uroce install` makes, from the runfiles.
make_prefix() {
  mkdir -p "$PREFIX/bin" "$PREFIX/lib/uroce" "$PREFIX/share/uroce" "$WORK/bin"
  cp verbs_api/libibverbs.so.1 verbs_api/librdmacm.so.1 verbs_api/liburoce_preload.so "$PREFIX/lib/uroce/"
  cp tools/uroce.bash "$PREFIX/share/uroce/"
  cp tools/uroce_launcher "$PREFIX/bin/uroce"
  cp tests/frameworks/rpma_check "$WORK/bin/"
  # The MPI program, built with each implementation's own compiler, as its users build theirs.
  mpicc.openmpi -O2 -o "$WORK/bin/mpi_check_openmpi" tests/frameworks/mpi_check.c &&
    mpicc.mpich -O2 -o "$WORK/bin/mpi_check_mpich" tests/frameworks/mpi_check.c
}

# The addresses whose device sent packets, from a log of `uroce run --stats` programs (one block per device).
devices_that_sent() {
  awk '/^uroce: counters of uroce0 at / {at = $6} /^tx_packets / && $2 > 0 {print at}' "$1" | sort -u | wc -l
}

# pair SERVER_LOG CLIENT_LOG :: SERVER_CMD... :: CLIENT_CMD...: starts the server, waits until it listens on $PORT,
# runs the client; sets PAIR_PROBLEMS (empty when both exited 0). ("::" because the commands hold "--".)
pair() {
  local server_log="$1" client_log="$2"
  shift 2
  [ "$1" = :: ] && shift
  local -a server=() client=()
  while [ $# -gt 0 ] && [ "$1" != :: ]; do server+=("$1"); shift; done
  shift
  client=("$@")
  PAIR_PROBLEMS=""
  timeout "$TIMEOUT" "${server[@]}" >"$server_log" 2>&1 &
  local pid=$!
  if ! wait_listening "$PORT" "$pid"; then
    PAIR_PROBLEMS="the server did not listen on $PORT:"$'\n'"$(tail -n 20 "$server_log")"
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    return
  fi
  local rc=0 src=0
  timeout "$TIMEOUT" "${client[@]}" >"$client_log" 2>&1 || rc=$?
  wait "$pid" || src=$?
  [ "$rc" -eq 0 ] || PAIR_PROBLEMS+="client exit status $rc:"$'\n'"$(tail -n 20 "$client_log")"$'\n'
  [ "$src" -eq 0 ] || PAIR_PROBLEMS+="server exit status $src:"$'\n'"$(tail -n 20 "$server_log")"$'\n'
}

# --- UCX ----------------------------------------------------------------------------------------------------------

case_ucx_info() {
  local out="$WORK/ucx_info.log" problems=""
  timeout "$TIMEOUT" "$UROCE" run -- ucx_info -d >"$out" 2>&1 || problems="ucx_info exit status $?"$'\n'
  local tl
  for tl in rc_verbs ud_verbs; do
    # "#      Transport: rc_verbs" followed by "#         Device: uroce0:1"
    awk -v tl="$tl" '$2 == "Transport:" {t = $3} $2 == "Device:" && t == tl && $3 == "uroce0:1" {found = 1}
                     END {exit !found}' "$out" || problems+="no $tl transport on device uroce0:1"$'\n'
  done
  junit_check "ucx_info -d lists uroce0 with rc_verbs and ud_verbs" "${problems:+$problems$(head -c 3000 "$out")}"
}

# case_ucx_perftest TLS TEST SIZE ITERATIONS [LOSS]
case_ucx_perftest() {
  local tls="$1" test="$2" size="$3" iters="$4" loss="${5:-}"
  local name="ucx_perftest $test $size B over UCX_TLS=$tls${loss:+ under $loss loss}"
  local -a faults=()
  [ -z "$loss" ] || faults=(--loss "$loss" --seed 5)
  PORT=$(free_tcp_port)
  local log="$WORK/ucx.$test.$size.${tls//,/_}${loss:+.loss}"
  pair "$log.server" "$log.client" \
    :: env UCX_TLS="$tls" UCX_NET_DEVICES=uroce0:1 "$UROCE" run "${faults[@]}" -- ucx_perftest -p "$PORT" \
    :: env UCX_TLS="$tls" UCX_NET_DEVICES=uroce0:1 "$UROCE" run "${faults[@]}" -- ucx_perftest -p "$PORT" \
    127.0.0.1 -t "$test" -s "$size" -n "$iters"
  local problems="$PAIR_PROBLEMS"
  grep -q '^Final:' "$log.client" || problems+="no Final: line from the client"$'\n'
  junit_check "$name" "$problems"
  [ -n "$problems" ] || grep '^Final:' "$log.client" | sed "s|^|    $test $tls${loss:+ loss $loss}: |"
}

# --- MPI ----------------------------------------------------------------------------------------------------------

# case_mpi openmpi|mpich RANKS
case_mpi() {
  local impl="$1" ranks="$2" log="$WORK/mpi.$1.$2.log" rc=0
  local -a launch
  if [ "$impl" = openmpi ]; then
    launch=(mpirun.openmpi --allow-run-as-root --oversubscribe -np "$ranks" --mca pml ucx --mca btl '^vader,tcp,openib,uct'
            -x UCX_TLS=self,rc_verbs,ud_verbs -x UCX_NET_DEVICES=uroce0:1)
  else
    launch=(env UCX_TLS=self,rc_verbs,ud_verbs UCX_NET_DEVICES=uroce0:1 mpirun.mpich -np "$ranks")
  fi
  timeout "$TIMEOUT" "$UROCE" run --stats -- "${launch[@]}" "$WORK/bin/mpi_check_$impl" >"$log" 2>&1 || rc=$?
  mpi_problems "$log" "$rc" "$ranks"
  junit_check "$impl -np $ranks (pml ucx, UCX_TLS=self,rc_verbs,ud_verbs): ping-pong, allreduce, alltoall" \
    "$MPI_PROBLEMS"
}

# mpi_problems LOG STATUS RANKS: sets MPI_PROBLEMS, empty when the job succeeded, checked its results and every rank
# sent packets through uroce.
mpi_problems() {
  MPI_PROBLEMS=""
  [ "$2" -eq 0 ] || MPI_PROBLEMS+="exit status $2"$'\n'
  grep -q "^ranks $3 errors 0$" "$1" || MPI_PROBLEMS+="no 'ranks $3 errors 0' line"$'\n'
  local sent
  sent=$(devices_that_sent "$1")
  [ "$sent" -ge "$3" ] || MPI_PROBLEMS+="only $sent devices sent packets, want one per rank ($3)"$'\n'
  [ -z "$MPI_PROBLEMS" ] || MPI_PROBLEMS+="$(grep -v '^[a-z_]* [0-9]*$' "$1" | tail -n 30)"
}

# --- librpma ------------------------------------------------------------------------------------------------------

case_rpma() {
  local log="$WORK/rpma"
  PORT=$(free_tcp_port)
  # The server prints the address it listens on (its device's); the client dials it.
  timeout "$TIMEOUT" "$UROCE" run -- "$WORK/bin/rpma_check" server "$PORT" >"$log.server" 2>&1 &
  local pid=$! addr="" problems="" rc=0 src=0
  for _ in $(seq 1 200); do
    addr=$(awk '/^listening / {print $2}' "$log.server")
    [ -z "$addr" ] && kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if [ -z "$addr" ]; then
    problems="the server did not listen:"$'\n'"$(tail -n 20 "$log.server")"
    kill "$pid" 2>/dev/null
  else
    timeout "$TIMEOUT" "$UROCE" run -- "$WORK/bin/rpma_check" client "$addr" "$PORT" >"$log.client" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || problems+="client exit status $rc: $(tail -n 20 "$log.client")"$'\n'
  fi
  wait "$pid" || src=$?
  [ "$src" -eq 0 ] || problems+="server exit status $src: $(tail -n 20 "$log.server")"$'\n'
  junit_check "librpma: read, write, flush, send/recv, bytes checked" "$problems"
}

# --- libfabric, in a network namespace --------------------------------------------------------------------------

# The namespace: lo, and a veth pair whose one end holds 10.77.0.1-8 (both ends here; the verbs provider wants an
# interface that is up and not loopback). Each process takes its own address with --addr 10.77.0.0/24.
setup_namespace() {
  ip link set lo up && ip link add uroce-a type veth peer name uroce-b && ip link set uroce-a up &&
    ip link set uroce-b up || return 1
  local i
  for i in 1 2 3 4 5 6 7 8; do ip addr add "10.77.0.$i/24" dev uroce-a || return 1; done
}

case_fi_info() {
  local out="$WORK/fi_info.log" problems=""
  timeout "$TIMEOUT" "$UROCE" run --addr 10.77.0.0/24 -- fi_info -p verbs >"$out" 2>&1 || problems="exit status $?"$'\n'
  # Entries are blocks of "provider: P", "domain: D", "type: T" lines.
  awk '/provider:/ {p = $2} /domain:/ {d = $2} /type:/ {print p, d, $2}' "$out" >"$out.entries"
  grep -qx 'verbs uroce0 FI_EP_MSG' "$out.entries" || problems+="no verbs MSG endpoint on uroce0"$'\n'
  grep -qx 'verbs;ofi_rxm uroce0 FI_EP_RDM' "$out.entries" || problems+="no verbs;ofi_rxm RDM endpoint on uroce0"$'\n'
  junit_check "fi_info -p verbs lists MSG and verbs;ofi_rxm RDM endpoints" "${problems:+$problems$(head -c 3000 "$out")}"
}

# case_fi_pingpong dgram|msg|rdm
case_fi_pingpong() {
  local ep="$1" log="$WORK/fi_pingpong.$1"
  PORT=$(free_tcp_port)
  pair "$log.server" "$log.client" \
    :: "$UROCE" run --addr 10.77.0.1 -- fi_pingpong -p verbs -e "$ep" -B "$PORT" -I 100 \
    :: "$UROCE" run --addr 10.77.0.0/24 -- fi_pingpong -p verbs -e "$ep" -P "$PORT" -I 100 10.77.0.1
  local problems="$PAIR_PROBLEMS"
  # Its last line is the largest size: bytes, iterations, "=100" (all checked and completed), ...
  tail -n 1 "$log.client" | grep -q '=100' || problems+="the client did not complete its 100 iterations"$'\n'
  junit_check "fi_pingpong -p verbs -e $ep" "$problems"
}

case_ompi_ofi() {
  local log="$WORK/mpi.ofi.log" rc=0
  timeout "$TIMEOUT" "$UROCE" run --addr 10.77.0.0/24 --stats -- mpirun.openmpi --allow-run-as-root --oversubscribe -np 4 \
    --mca pml cm --mca mtl ofi --mca btl '^vader,tcp,openib,uct' -x 'FI_PROVIDER=verbs;ofi_rxm' \
    "$WORK/bin/mpi_check_openmpi" >"$log" 2>&1 || rc=$?
  mpi_problems "$log" "$rc" 4
  junit_check "openmpi -np 4 (pml cm, mtl ofi, verbs;ofi_rxm): ping-pong, allreduce, alltoall" "$MPI_PROBLEMS"
}

in_namespace() {
  if ! setup_namespace 2>"$WORK/netns.err"; then
    local reason="cannot set up the namespace's interfaces: $(head -n 1 "$WORK/netns.err")"
    for name in fi_info fi_pingpong_dgram fi_pingpong_msg fi_pingpong_rdm openmpi_ofi; do junit_skip "$name" "$reason"; done
    return 0
  fi
  case_fi_info
  case_fi_pingpong dgram
  case_fi_pingpong msg
  case_fi_pingpong rdm
  case_ompi_ofi
}

if [ "${1:-}" = --in-namespace ]; then
  in_namespace
  exit 0
fi

mkdir -p "$WORK"
if ! make_prefix >"$WORK/prefix.log" 2>&1; then
  junit_fail "the installed layout and the test programs build" "$(cat "$WORK/prefix.log")"
  junit_report tests.frameworks
  exit 1
fi
case_ucx_info
for tls in rc_verbs,ud_verbs ud_verbs; do
  case_ucx_perftest "$tls" tag_bw 65536 1000
  case_ucx_perftest "$tls" tag_lat 8 2000
  case_ucx_perftest "$tls" ucp_put_bw 65536 1000
  case_ucx_perftest "$tls" ucp_get 65536 200
  case_ucx_perftest "$tls" tag_bw 65536 200 0.01
  case_ucx_perftest "$tls" ucp_put_bw 65536 200 0.01
done
case_mpi openmpi 2
case_mpi openmpi 4
case_mpi mpich 2
case_mpi mpich 4
case_rpma
if [ "$(id -u)" -ne 0 ]; then
  for name in fi_info fi_pingpong_dgram fi_pingpong_msg fi_pingpong_rdm openmpi_ofi; do
    junit_skip "libfabric: $name" "needs root for a network namespace with a non-loopback interface (the verbs provider refuses loopback ones)"
  done
elif ! unshare --net -- true 2>"$WORK/unshare.err"; then
  for name in fi_info fi_pingpong_dgram fi_pingpong_msg fi_pingpong_rdm openmpi_ofi; do
    junit_skip "libfabric: $name" "cannot make a network namespace: $(head -n 1 "$WORK/unshare.err")"
  done
else
  WORK="$WORK" PREFIX="$PREFIX" unshare --net -- bash "$0" --in-namespace
fi
junit_report tests.frameworks
