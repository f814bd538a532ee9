#!/bin/bash
# The latency baselines `uroce bench rc` reads from uroce_bench: each run ends and prints one positive figure (us);
# and the latency floor `uroce bench vs-rxe` runs in its guest (shm-lat): two positive figures, the typical half round
# trip and the 99.9th percentile, the second not below the first, the typical at least the fixed work asked for.
# No speed is asserted (figures belong in benchmarks, not tests); a baseline that hangs, fails, loses its reply or
# prints nothing fails here.
set -u
bench="$1"
status=0
for mode in --busy --roce; do
  out=$(timeout 20 "$bench" udp-lat "$mode" --seconds 0.2)
  rc=$?
  if [ $rc -ne 0 ] || ! awk -v v="$out" 'BEGIN {exit !(v ~ /^[0-9]+\.[0-9]+$/ && v > 0)}'; then
    echo "FAIL: udp-lat $mode exited $rc, printed '$out'"
    status=1
  else
    echo "ok: udp-lat $mode: $out us"
  fi
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
exit $status
