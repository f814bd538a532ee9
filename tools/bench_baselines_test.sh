#!/bin/bash
# The latency baselines `uroce bench rc` reads from uroce_bench: each run ends and prints one positive figure (us);
# and the latency floor `uroce bench vs-rxe` runs in its guest (shm-lat): two positive figures, the typical half round
# trip and the 99.9th percentile, the second not below the first, the typical at least the fixed work asked for.
# The stream across a veth pair `uroce bench hosts` reads (udp-gbps --between, root: two network namespaces of its
# own): one positive figure (GB/s); a namespace that is not there: an error, no figure.
# No speed is asserted (figures belong in benchmarks, not tests); a baseline that hangs, fails, loses its reply or
# prints nothing fails here.
set -u
bench="$1"
status=0
# shellcheck source=tools/uroce.bash
source tools/uroce.bash

# positive_figure WHAT UNIT COMMAND...: COMMAND ends within 20 s and prints one positive figure.
positive_figure() {
  local what="$1" unit="$2" out rc
  shift 2
  out=$(timeout 20 "$@")
  rc=$?
  if [ $rc -ne 0 ] || ! awk -v v="$out" 'BEGIN {exit !(v ~ /^[0-9]+\.[0-9]+$/ && v > 0)}'; then
    echo "FAIL: $what exited $rc, printed '$out'"
    status=1
  else
    echo "ok: $what: $out $unit"
  fi
}

for mode in --busy --roce; do
  positive_figure "udp-lat $mode" us "$bench" udp-lat "$mode" --seconds 0.2
done
for work in 0 20; do
  out=$(timeout 20 "$bench" shm-lat --iterations 2000 --work-us "$work")
  rc=$?
  if [ $rc -ne 0 ] || ! awk -v w="$work" -v line="$out" 'BEGIN {
      n = split(line, v, " ")
      exit !(n == 2 && v[1] ~ /^[0-9]+\.[0-9]+$/ && v[2] ~ /^[0-9]+\.[0-9]+$/ && v[1] > 0 && v[2] >= v[1] && v[1] >= 0.9 * w)
    }'; then
    echo "FAIL: shm-lat --work-us $work exited $rc, printed '$out'"
    status=1
  else
    echo "ok: shm-lat --work-us $work: typical and p99.9 $out us"
  fi
done
# An echo that dies mid-run ends the floor with an error, not a spin that never ends (the run asked for would last
# over four minutes).
"$bench" shm-lat --iterations 5000000 --work-us 50 >/dev/null 2>&1 &
floor=$!
echo_pid=""
for _ in $(seq 1 100); do
  echo_pid=$(pgrep -P "$floor" | head -n 1)
  [ -n "$echo_pid" ] && break
  sleep 0.05
done
if [ -z "$echo_pid" ]; then
  echo "FAIL: shm-lat started no echo process"
  kill -KILL "$floor" 2>/dev/null
  status=1
else
  kill -KILL "$echo_pid"
  for _ in $(seq 1 200); do
    kill -0 "$floor" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$floor" 2>/dev/null; then
    kill -KILL "$floor"
    echo "FAIL: shm-lat still ran 10 s after its echo was killed"
    status=1
  fi
  wait "$floor"
  rc=$?
  if [ "$rc" -eq 1 ]; then
    echo "ok: shm-lat fails when its echo dies"
  else
    echo "FAIL: shm-lat with its echo killed exited $rc, want 1"
    status=1
  fi
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "skip: udp-gbps --between needs root and network namespaces"
elif ! two_hosts_up "bench-baselines-$$"; then
  echo "FAIL: could not join two namespaces by a veth: $TWO_HOSTS_ERROR"
  status=1
else
  positive_figure "udp-gbps across a veth" GB/s "$bench" udp-gbps --between "$HOST_A" "$ADDR_A" "$HOST_B" --frame 1064 \
    --seconds 0.2
  out=$(timeout 20 "$bench" udp-gbps --between "$HOST_A-gone" "$ADDR_A" "$HOST_B" --seconds 0.2 2>&1)
  rc=$?
  if [ $rc -ne 1 ] || [[ "$out" != *"No such file"* ]]; then
    echo "FAIL: udp-gbps --between a namespace that is not there exited $rc, printed '$out'"
    status=1
  else
    echo "ok: udp-gbps --between a missing namespace: $out"
  fi
  two_hosts_down
fi
exit $status
