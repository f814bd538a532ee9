#!/bin/sh
# Runs inside the QEMU guest of tests/interop/build_guest.sh for `tools/uroce bench vs-rxe` (as its uroce_run): the
# same unmodified perftest pairs over the kernel's rxe0 and over uroce (installed in /opt/uroce, the host device on
# eth0's address), alternating, each pair's two processes in this guest. busybox sh: no bash here.
#
# Kernel command line (the guest's /init has them in its environment): uroce_addr=A.B.C.D/N (eth0's address),
# uroce_rounds=N (default 3), uroce_quick=1 (short runs: a smoke test). Prints one line per figure:
#   vs-rxe: IMPL TEST VALUE [P999]      IMPL rxe|uroce; TEST write_bw|read_bw (MB/s) or send_lat|write_lat (typical
#                                       and 99.9th percentile, us)
#   vs-rxe: floor TEST VALUE P999       after each uroce latency pair: two processes bouncing a message through shared
#                                       memory with fixed work making each half round trip last uroce's typical of
#                                       that pair (/opt/uroce/bin/uroce_bench shm-lat): no device at all, so its tail
#                                       is this guest's own
# and "vs-rxe: failed IMPL TEST: ..." for a pair that did not finish; "vs-rxe: retried IMPL TEST: ..." for a run
# whose clock estimate failed, run again.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
addr=${uroce_addr%/*}
rounds=${uroce_rounds:-3}
lib=/opt/uroce/lib/uroce
if [ "${uroce_quick:-0}" = 1 ]; then
  bw_iters=200
  lat_iters=500
else
  bw_iters=2000
  lat_iters=5000
fi
port=18515
port_hex=$(printf %04X $port)

# rxe0's GID index of eth0's IPv4 address (::ffff:A.B.C.D): RoCEv2 over IPv4, as uroce's GID 0 is.
rxe_gid_index() {
  want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' $(echo "$addr" | tr . ' '))
  for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
    [ "$(cat "$f" 2>/dev/null)" = "$want" ] && { basename "$f"; return; }
  done
  echo 1
}

# rdma_rxe holds UDP 4791 on every address of the namespace while it is loaded: one of the two at a time.
rxe_up() {
  # uroce's device service lingers 0.5 s after its last process, holding UDP 4791 (12B7): rxe cannot bind it before.
  tries=0
  while grep -q ':12B7 ' /proc/net/udp /proc/net/udp6 2>/dev/null && [ $tries -lt 200 ]; do
    usleep 50000
    tries=$((tries + 1))
  done
  /sbin/modprobe rdma_rxe && /usr/bin/rdma link add rxe0 type rxe netdev eth0 || echo "vs-rxe: rxe0 did not come back"
  tries=0
  while [ ! -e /sys/class/infiniband/rxe0/ports/1/gids/1 ] && [ $tries -lt 100 ]; do
    usleep 50000
    tries=$((tries + 1))
  done
}
rxe_down() {
  /usr/bin/rdma link delete rxe0
  /sbin/modprobe -r rdma_ucm rdma_rxe
}

listening() { grep -q ":$port_hex [0-9A-F]*:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null; }

# pair IMPL TEST PROGRAM ARGS...: one perftest pair; prints its figure line.
pair() {
  impl=$1 test=$2
  shift 2
  if [ "$impl" = rxe ]; then
    set -- "$@" -d rxe0 -x "$(rxe_gid_index)"
    launch=""
  else
    set -- "$@" -d uroce0 -x 0
    launch="env LD_LIBRARY_PATH=$lib LD_PRELOAD=$lib/liburoce_preload.so UROCE_DEVICE=host UROCE_ADDR=$addr"
  fi
  # perftest printing "inf" or "nan" (below) is its own clock estimate failing: the pair runs again, at most twice more,
  # and says so. In the guest 1 uroce ib_send_lat run in 12 did (the estimate times usleep against the cycle counter
  # while uroce's threads start beside it on 2 vCPUs); the smoke run, which wants a figure from each pair, failed then.
  attempt=1
  while :; do
    $launch timeout -s KILL 300 "$@" -p $port >/tmp/server.out 2>&1 &
    server=$!
    tries=0
    while ! listening && [ $tries -lt 600 ]; do
      usleep 50000
      tries=$((tries + 1))
    done
    $launch timeout -s KILL 300 "$@" -p $port "$addr" >/tmp/client.out 2>&1
    rc=$?
    wait $server
    line=$(grep -A1 '#bytes' /tmp/client.out | tail -n 1)
    case "$test" in
      *_bw) value=$(echo "$line" | awk '{print $4}') p999="" ;;
      *) value=$(echo "$line" | awk '{print $5}') p999=$(echo "$line" | awk '{print $9}') ;;
    esac
    unmeasured=0
    [ "$rc" -eq 0 ] && [ -n "$value" ] && { ! is_figure "$value" || { [ -n "$p999" ] && ! is_figure "$p999"; }; } &&
      unmeasured=1
    if [ "$unmeasured" != 1 ] || [ $attempt -ge 3 ]; then break; fi
    echo "vs-rxe: retried $impl $test: perftest printed '$value' '$p999'"
    attempt=$((attempt + 1))
  done
  if [ "$rc" -ne 0 ] || [ -z "$value" ]; then
    echo "vs-rxe: failed $impl $test: exit $rc: $(tail -n 3 /tmp/client.out | tr '\n' ' ')"
  elif [ "$unmeasured" = 1 ]; then
    # perftest printed "inf" or "nan" three times: its own estimate of the clock failed (a TCG guest's cycle counter),
    # the run did not. No figure, not a fast one: left out of the medians, and said.
    echo "vs-rxe: unmeasured $impl $test: perftest printed '$value' '$p999'"
  else
    echo "vs-rxe: $impl $test $value $p999"
    [ "$impl" = uroce ] && [ -n "$p999" ] && floor "$test" "$value"
  fi
}

# floor TEST TYPICAL: the same number of round trips without a device, each half taking TYPICAL us of fixed work.
floor() {
  bench=/opt/uroce/bin/uroce_bench
  if [ ! -x "$bench" ]; then
    echo "vs-rxe: unmeasured floor $1: no $bench in the guest"
    return
  fi
  out=$(timeout -s KILL 300 "$bench" shm-lat --iterations "$lat_iters" --work-us "$2" 2>&1)
  # shellcheck disable=SC2086  # the two figures split into $2 and $3
  set -- "$1" $out
  if is_figure "$2" && is_figure "$3"; then
    echo "vs-rxe: floor $1 $2 $3"
  else
    echo "vs-rxe: unmeasured floor $1: uroce_bench printed '$*'"
  fi
}

# is_figure TEXT: a plain decimal number (not empty, inf or nan).
is_figure() { case "$1" in '' | *[!0-9.]* | *.*.*) return 1 ;; *) return 0 ;; esac; }

run_all() {
  pair "$1" write_bw ib_write_bw -s 65536 -n $bw_iters
  pair "$1" read_bw ib_read_bw -s 65536 -n $bw_iters
  pair "$1" send_lat ib_send_lat -s 2 -n $lat_iters
  pair "$1" write_lat ib_write_lat -s 8 -n $lat_iters
}

echo "vs-rxe: guest $(uname -r), $(grep -c ^processor /proc/cpuinfo) CPUs, eth0 MTU $(cat /sys/class/net/eth0/mtu)," \
  "$rounds rounds"
# rxe0 is up (the guest's /init made it): rxe first, then uroce, alternating.
round=1
while [ $round -le "$rounds" ]; do
  run_all rxe
  rxe_down
  run_all uroce
  rxe_up
  round=$((round + 1))
done
