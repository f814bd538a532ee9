#!/bin/bash
# The latency baselines `uroce bench rc` reads from uroce_bench: each run ends and prints one positive figure (us).
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
exit $status
