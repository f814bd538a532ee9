#!/usr/bin/env bash
# The whole suite, as `tools/uroce test` and CI run it:
#   1. every Bazel test target (unit tests beside the code, integration tests in tests/);
#   2. tests/tools_test.sh: this runner, `tools/uroce run` and `tools/uroce install` (they call Bazel themselves, so
#      they cannot be Bazel tests);
#   3. the wire, emu and verbs_api tests again under ASan+UBSan, and the threaded ones under TSan;
#   4. the libFuzzer packet parser for a bounded time (UROCE_FUZZ_SECONDS, default 60).
# Counts individual test cases from the JUnit XML each target wrote in this run (Bazel's build events name them, see
# tests/junit_count.py) and ends with the line "N passed, N failed" (", N skipped" and ", N flaky" when some were),
# after a summary that names every skipped case with its reason and every flaky target (one that passed only on a
# retry: its cases are counted as flaky, not as passed). Exits non-zero when any case or target failed, a target left
# no result, or any Bazel invocation failed.
#
# UROCE_TEST_TARGETS="//pkg:a //pkg:b" runs only those targets ("manual" ones included) with the extra Bazel flags
# in UROCE_TEST_FLAGS, and no other stage: tests/tools_test.sh points it at deliberately failing fixtures that way.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY=/usr/bin/python3
FUZZ_SECONDS="${UROCE_FUZZ_SECONDS:-60}"
total_pass=0
total_fail=0
total_skip=0
total_flaky=0
WORK=$(mktemp -d "${TMPDIR:-/tmp}/uroce-run-all.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SUMMARY="$WORK/summary"  # the SKIPPED and FLAKY lines of every stage, repeated before the closing line
: >"$SUMMARY"

# add_counts NAME "PASSED FAILED [SKIPPED [FLAKY]]": adds a stage's counts to the totals.
add_counts() {
  local p f s k
  read -r p f s k <<<"$2"
  if ! [[ "$p" =~ ^[0-9]+$ && "$f" =~ ^[0-9]+$ && "${s:-0}" =~ ^[0-9]+$ && "${k:-0}" =~ ^[0-9]+$ ]]; then
    echo "[$1] FAILED: no counts ('$2')" >&2
    p=0 f=1 s=0 k=0
  fi
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + ${s:-0}))
  total_flaky=$((total_flaky + ${k:-0}))
}

# run_bazel_tests NAME PATTERN [bazel flags...]: runs the test targets of PATTERN (without the "manual" ones unless
# INCLUDE_MANUAL=1), then adds the cases this invocation ran to the totals. A failed query or a failed `bazel test`
# counts as a failure even when no case says so.
# Each stage's wall time, said when it ends and again before the closing line: where a run's time went (CI's limit).
TIMES="$WORK/times"
: >"$TIMES"
stage_took() {  # stage_took NAME START_SECONDS
  local line
  line="[$1] took $((SECONDS - $2)) s"
  echo "$line" >&2
  echo "$line" >>"$TIMES"
}

run_bazel_tests() {
  local name="$1" pattern="$2" started=$SECONDS; shift 2
  local query="tests($pattern) except attr(tags, 'manual', $pattern)"
  [ "${INCLUDE_MANUAL:-0}" = 1 ] && query="tests($pattern)"
  local targets
  if ! targets=$(bazel query "$query" 2>"$WORK/query.err") || [ -z "$targets" ]; then
    cat "$WORK/query.err" >&2
    echo "[$name] FAILED: no test targets under $pattern" >&2
    total_fail=$((total_fail + 1))
    return
  fi
  echo "[$name] bazel test $pattern $*" >&2
  local events="$WORK/$name.events.json" rc=0
  rm -f "$events"
  # shellcheck disable=SC2086
  bazel test "$@" --keep_going --build_event_json_file="$events" $targets >&2 || rc=$?
  local counts p f s k
  # shellcheck disable=SC2086
  counts=$("$PY" "$ROOT/tests/junit_count.py" "$name" "$events" $targets)
  read -r p f s k <<<"$(tail -n1 <<<"$counts")"
  sed '$d' <<<"$counts" >&2
  grep -E '^\[[^]]*\] (SKIPPED|FLAKY) ' <<<"$counts" >>"$SUMMARY"
  if [ "$rc" -ne 0 ] && [ "${f:-0}" = 0 ]; then
    echo "[$name] FAILED: bazel test exited with status $rc" >&2
    f=1
  fi
  add_counts "$name" "$p $f $s $k"
  stage_took "$name" "$started"
}

# The summary of skipped and flaky cases, then the closing line, "N passed, N failed" (", N skipped", ", N flaky" when
# some were); the exit status says whether all passed.
print_totals_and_exit() {
  if [ -s "$TIMES" ]; then
    echo "Time by stage ($SECONDS s in all):"
    sed 's/^/  /' "$TIMES"
  fi
  if [ -s "$SUMMARY" ]; then
    echo "Skipped and flaky, with their reasons:"
    sed 's/^/  /' "$SUMMARY"
  fi
  local line="$total_pass passed, $total_fail failed"
  [ "$total_skip" -eq 0 ] || line+=", $total_skip skipped"
  [ "$total_flaky" -eq 0 ] || line+=", $total_flaky flaky"
  echo "$line"
  [ "$total_fail" -eq 0 ]
  exit
}

if [ -n "${UROCE_TEST_TARGETS:-}" ]; then
  # shellcheck disable=SC2086
  INCLUDE_MANUAL=1 run_bazel_tests selected "$(sed 's/  */ + /g' <<<"${UROCE_TEST_TARGETS}")" ${UROCE_TEST_FLAGS:-}
  print_totals_and_exit
fi

# The client tests run real programs that shake hands over free TCP ports and share the machine with every other
# test; one that fails once and passes on a second attempt is reported FLAKY (and listed), not hidden.
run_bazel_tests unit+integration //... --flaky_test_attempts=//tests[:/].*@2

# Tests of this runner, `tools/uroce run` and `tools/uroce install`: progress on stderr, "N passed, N failed" on stdout.
echo "[tools] tests/tools_test.sh" >&2
started=$SECONDS
tools_rc=0
"$ROOT/tests/tools_test.sh" >"$WORK/tools.out" || tools_rc=$?
tools_counts=$(sed -nE 's/^([0-9]+) passed, ([0-9]+) failed(, ([0-9]+) skipped)?$/\1 \2 \4/p' "$WORK/tools.out" | tail -n1)
grep '^\[tools\] SKIPPED ' "$WORK/tools.out" >>"$SUMMARY"
if [ "$tools_rc" -ne 0 ] && [ "$(cut -d' ' -f2 <<<"$tools_counts")" = 0 ]; then
  echo "[tools] FAILED: tests/tools_test.sh exited with status $tools_rc" >&2
  tools_counts="0 1 0"
fi
add_counts tools "$tools_counts"
stage_took tools "$started"

if [ "${UROCE_SKIP_SANITIZERS:-0}" != 1 ]; then
  # The engine's own tests (no Debian client processes) under ASan+UBSan and under TSan.
  run_bazel_tests asan "//wire/... + //emu/... + //verbs_api/... + //rdmacm/... + //service/..." --config=asan
  run_bazel_tests tsan "//emu/... + //verbs_api/... + //rdmacm/... + //service/... + //wire:host_device_transport_test + //wire:direct_access_test + //wire:packet_ring_test + //wire:uring_transport_test + //wire:udp_transport_test + //wire:socket_transport_test + //wire:sim_network_test + //wire:fault_transport_test + //wire:capture_transport_test" --config=tsan
fi

# Fuzzing: a bounded libFuzzer run of the packet parser and of the emulated HCA (stateful: packets at live QPs, the CM
# and memory of a device on the simulated fabric), each from its corpus; a crash, a sanitizer report or a violated
# invariant fails it. The clang build lives in its own output base: switching the C++ compiler in the main one would
# discard the gcc build (see .bazelrc).
FUZZ_BAZEL=(bazel --output_base="${HOME}/.cache/uroce-fuzz-output")
for target in //wire/fuzz:packet_fuzzer //emu/fuzz:device_fuzzer; do
  name="${target##*:}" package="${target#//}"
  package="${package%%:*}"
  echo "[fuzz] $name for ${FUZZ_SECONDS}s" >&2
  started=$SECONDS
  if "${FUZZ_BAZEL[@]}" build --config=fuzz --symlink_prefix=/ "$target" >&2; then
    fuzzer="$("${FUZZ_BAZEL[@]}" info --config=fuzz bazel-bin 2>/dev/null)/$package/$name"
    corpus=$(mktemp -d)
    if [ -d "$package/corpus" ]; then cp "$package"/corpus/* "$corpus"/ 2>/dev/null || true; fi
    if "$fuzzer" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 "$corpus" >"$corpus.log" 2>&1; then
      echo "[fuzz] PASS: $name $(grep -E 'stat::number_of_executed_units' "$corpus.log" || true)" >&2
      total_pass=$((total_pass + 1))
    else
      tail -n 60 "$corpus.log" >&2
      echo "[fuzz] FAIL: $name found a crash" >&2
      total_fail=$((total_fail + 1))
    fi
    rm -rf "$corpus" "$corpus.log"
  else
    echo "[fuzz] FAIL: $name did not build" >&2
    total_fail=$((total_fail + 1))
  fi
  stage_took "fuzz $name (its build too)" "$started"
done

# Clang's thread-safety analysis of the locks the annotations describe (emu/thread_annotations.h): a guarded member
# touched without its mutex, or a lock left held, fails the build. Same clang output base as the fuzzers.
echo "[tsa] clang -Wthread-safety over //emu //wire //verbs_api //rdmacm" >&2
started=$SECONDS
if "${FUZZ_BAZEL[@]}" build --config=tsa --symlink_prefix=/ //emu/... //wire/... //verbs_api/... //rdmacm/... >&2; then
  echo "[tsa] PASS" >&2
  total_pass=$((total_pass + 1))
else
  echo "[tsa] FAIL: the thread-safety analysis found a lock the annotations do not allow" >&2
  total_fail=$((total_fail + 1))
fi
stage_took tsa "$started"
"${FUZZ_BAZEL[@]}" shutdown >/dev/null 2>&1 || true

print_totals_and_exit
