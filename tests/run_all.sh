#!/usr/bin/env bash
# The whole suite, as `tools/uroce test` and CI run it:
#   1. every Bazel test target (unit tests beside the code, integration tests in tests/);
#   2. the wire, emu and verbs_api tests again under ASan+UBSan, and the threaded ones under TSan;
#   3. the libFuzzer packet parser for a bounded time (UROCE_FUZZ_SECONDS, default 60).
# Counts individual test cases from each target's JUnit XML and ends with the line "N passed, N failed".
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY=/usr/bin/python3
FUZZ_SECONDS="${UROCE_FUZZ_SECONDS:-60}"
total_pass=0
total_fail=0
total_skip=0

# run_bazel_tests NAME PATTERN [bazel flags...]: runs the tests, then adds their cases to the totals.
run_bazel_tests() {
  local name="$1" pattern="$2"; shift 2
  local targets
  targets=$(bazel query "tests($pattern) except attr(tags, 'manual', $pattern)" 2>/dev/null)
  if [ -z "$targets" ]; then
    echo "[$name] no test targets under $pattern" >&2
    total_fail=$((total_fail + 1))
    return
  fi
  echo "[$name] bazel test $pattern $*" >&2
  # shellcheck disable=SC2086
  bazel test "$@" --keep_going $targets >&2
  local testlogs counts
  testlogs=$(bazel info "$@" bazel-testlogs 2>/dev/null)
  counts=$("$PY" "$ROOT/tests/junit_count.py" "$name" "$testlogs" $targets)
  read -r p f s <<<"$(tail -n1 <<<"$counts")"
  sed '$d' <<<"$counts" >&2
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
}

run_bazel_tests unit+integration //...
if [ "${UROCE_SKIP_SANITIZERS:-0}" != 1 ]; then
  # The engine's own tests (no Debian client processes) under ASan+UBSan and under TSan.
  run_bazel_tests asan "//wire/... + //emu/... + //verbs_api/..." --config=asan
  run_bazel_tests tsan "//emu/... + //verbs_api/... + //wire:uring_transport_test + //wire:udp_transport_test + //wire:socket_transport_test + //wire:sim_network_test + //wire:fault_transport_test + //wire:capture_transport_test" --config=tsan
fi

# Fuzzing: a bounded libFuzzer run of the packet parser; a crash or sanitizer report fails it. The clang build lives in
# its own output base: switching the C++ compiler in the main one would discard the gcc build (see .bazelrc).
FUZZ_BAZEL=(bazel --output_base="${HOME}/.cache/uroce-fuzz-output")
if bazel query //wire/fuzz:packet_fuzzer >/dev/null 2>&1; then
  echo "[fuzz] packet_fuzzer for ${FUZZ_SECONDS}s" >&2
  if "${FUZZ_BAZEL[@]}" build --config=fuzz --symlink_prefix=/ //wire/fuzz:packet_fuzzer >&2; then
    fuzzer="$("${FUZZ_BAZEL[@]}" info --config=fuzz bazel-bin 2>/dev/null)/wire/fuzz/packet_fuzzer"
    corpus=$(mktemp -d)
    if [ -d wire/fuzz/corpus ]; then cp wire/fuzz/corpus/* "$corpus"/ 2>/dev/null || true; fi
    if "$fuzzer" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 "$corpus" >"$corpus.log" 2>&1; then
      echo "[fuzz] PASS: $(grep -E 'stat::number_of_executed_units' "$corpus.log" || true)" >&2
      total_pass=$((total_pass + 1))
    else
      tail -n 60 "$corpus.log" >&2
      echo "[fuzz] FAIL: packet_fuzzer found a crash" >&2
      total_fail=$((total_fail + 1))
    fi
    rm -rf "$corpus" "$corpus.log"
    "${FUZZ_BAZEL[@]}" shutdown >/dev/null 2>&1 || true
  else
    echo "[fuzz] FAIL: packet_fuzzer did not build" >&2
    total_fail=$((total_fail + 1))
  fi
fi

if [ "$total_skip" -gt 0 ]; then
  echo "$total_pass passed, $total_fail failed, $total_skip skipped"
else
  echo "$total_pass passed, $total_fail failed"
fi
[ "$total_fail" -eq 0 ]
