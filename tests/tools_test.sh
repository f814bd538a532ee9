#!/usr/bin/env bash
# Tests of the commands that call Bazel themselves, so cannot be Bazel tests: the suite runner tests/run_all.sh,
# `tools/uroce run` and `tools/uroce install`. tests/run_all.sh runs this file as its "tools" stage.
#
#   tests/tools_test.sh [CASE...]     default: every case; progress on stderr, on stdout the closing line
#                                     "N passed, N failed"; exit status non-zero when a case failed.
#
# The runner cases point tests/run_all.sh (UROCE_TEST_TARGETS, which runs those targets only and no other stage) at
# the deliberately failing "manual" targets in tests/runner_fixtures, which the suite's //... never runs.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=tools/uroce.bash
source "$ROOT/tools/uroce.bash"
# Each process a device of its own on a loopback address, as in the Bazel tests (.bazelrc): the default, the host
# device, would take this machine's own address; tests/host_device_test.sh tests it in namespaces of its own.
export UROCE_DEVICE=process

WORK=$(mktemp -d "${TMPDIR:-/tmp}/uroce-tools-test.XXXXXX")
SERVER_PID=""
NETNS=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi
  if [ -n "$NETNS" ]; then ip netns del "$NETNS" 2>/dev/null; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

FIXTURES=//tests/runner_fixtures
case_ok=1
case_skipped=""
fail() { echo "    FAIL: $*" >&2; case_ok=0; }
skip() { case_skipped="$*"; }  # skip REASON: the case did not run here, and says why
expect_status() {  # expect_status WANT GOT WHAT; WANT "nonzero" accepts any failure
  if [ "$1" = nonzero ]; then [ "$2" -ne 0 ] || fail "$3: exit status 0, want non-zero"
  else [ "$2" -eq "$1" ] || fail "$3: exit status $2, want $1"; fi
}
expect_grep() {  # expect_grep PATTERN FILE WHAT
  grep -qE -- "$1" "$2" || { fail "$3: no line matches '$1' in:"; sed 's/^/      | /' "$2" >&2; }
}

# run_runner TARGETS [BAZEL FLAGS]: tests/run_all.sh on TARGETS only; sets RC, $WORK/runner.out (the closing line) and
# $WORK/runner.err (its log).
run_runner() {
  RC=0
  UROCE_TEST_TARGETS="$1" UROCE_TEST_FLAGS="${2:-}" "$ROOT/tests/run_all.sh" >"$WORK/runner.out" 2>"$WORK/runner.err" ||
    RC=$?
}
closing_line() { tail -n1 "$WORK/runner.out"; }

test_runner_counts_a_passing_target() {
  run_runner "$FIXTURES:passes_test"
  expect_status 0 "$RC" "runner on a passing target"
  [ "$(closing_line)" = "1 passed, 0 failed" ] || fail "closing line '$(closing_line)', want '1 passed, 0 failed'"
  # Where the time went: each stage's, in its log and again before the closing line.
  expect_grep '^\[selected\] took [0-9]+ s$' "$WORK/runner.err" "the stage's time in the log"
  expect_grep '^  \[selected\] took [0-9]+ s$' "$WORK/runner.out" "the stage's time before the closing line"
}

test_runner_fails_when_a_target_fails() {
  run_runner "$FIXTURES:passes_test $FIXTURES:fails_test"
  expect_status nonzero "$RC" "runner on a failing target"
  [ "$(closing_line)" = "1 passed, 1 failed" ] || fail "closing line '$(closing_line)', want '1 passed, 1 failed'"
  expect_grep "FAILED $FIXTURES:fails_test" "$WORK/runner.err" "the failing target is named"
}

test_runner_fails_when_a_target_times_out() {
  run_runner "$FIXTURES:hangs_test" "--test_timeout=2"
  expect_status nonzero "$RC" "runner on a target that times out"
  [ "$(closing_line)" = "0 passed, 1 failed" ] || fail "closing line '$(closing_line)', want '0 passed, 1 failed'"
  expect_grep "FAILED $FIXTURES:hangs_test" "$WORK/runner.err" "the timed-out target is named"
}

# A target that passed once and then no longer builds leaves the first run's test.xml in bazel-testlogs: the runner
# must count the second run as a failure with no result, not as the old pass.
test_runner_ignores_a_stale_result() {
  run_runner "$FIXTURES:breakable_test"
  expect_status 0 "$RC" "first run (builds and passes)"
  local xml
  xml="$(cd "$ROOT" && bazel info bazel-testlogs 2>/dev/null)/tests/runner_fixtures/breakable_test/test.xml"
  [ -f "$xml" ] || fail "the first run left no $xml"
  run_runner "$FIXTURES:breakable_test" "--define=uroce_runner_fixture_break=1"
  expect_status nonzero "$RC" "second run (does not build)"
  [ "$(closing_line)" = "0 passed, 1 failed" ] || fail "closing line '$(closing_line)', want '0 passed, 1 failed'"
  expect_grep "FAILED $FIXTURES:breakable_test: no result in this run" "$WORK/runner.err" "no result"
  [ -f "$xml" ] || fail "the stale $xml is gone: the case proved nothing"
}

# A target that fails and then passes on a retry is FLAKY: named with its reason before the closing line, its case
# counted as flaky, not as passed, and the run still succeeds (Bazel's retry did).
test_runner_reports_a_flaky_target() {
  local marker="$WORK/flaky.marker"
  run_runner "$FIXTURES:flaky_test" "--flaky_test_attempts=2 --test_env=UROCE_FIXTURE_MARKER=$marker"
  expect_status 0 "$RC" "runner on a target that passes on its second attempt"
  [ "$(closing_line)" = "0 passed, 0 failed, 1 flaky" ] || fail "closing line '$(closing_line)', want '0 passed, 0 failed, 1 flaky'"
  expect_grep "FLAKY $FIXTURES:flaky_test: failed an attempt, passed on a later one" "$WORK/runner.out" \
    "the flaky target is named in the summary"
}

test_runner_fails_on_an_unknown_target() {
  run_runner "$FIXTURES:no_such_test"
  expect_status nonzero "$RC" "runner on a target that does not exist"
  [ "$(closing_line)" = "0 passed, 1 failed" ] || fail "closing line '$(closing_line)', want '0 passed, 1 failed'"
}

# `uroce run` runs the program in the caller's directory, with the options applied, and returns its exit status.
test_run_keeps_directory_and_exit_status() {
  local dir="$WORK/caller dir" rc=0
  mkdir -p "$dir"
  printf '#!/bin/sh\npwd -P\nibv_devinfo\nexit 7\n' >"$dir/probe.sh"
  chmod +x "$dir/probe.sh"
  (cd "$dir" && "$ROOT/tools/uroce" run --mtu 1024 -- ./probe.sh) >"$WORK/run.out" 2>&1 || rc=$?
  expect_status 7 "$rc" "uroce run -- ./probe.sh (exit 7)"
  [ "$(head -n1 "$WORK/run.out")" = "$(cd "$dir" && pwd -P)" ] ||
    fail "ran in '$(head -n1 "$WORK/run.out")', want '$dir'"
  expect_grep "hca_id:[[:space:]]+uroce0" "$WORK/run.out" "ibv_devinfo lists uroce0"
  expect_grep "active_mtu:[[:space:]]+1024" "$WORK/run.out" "--mtu 1024 applied"
  rc=0
  "$ROOT/tools/uroce" run --bogus -- true 2>"$WORK/run.err" || rc=$?
  expect_status 2 "$rc" "uroce run --bogus"
  rc=0
  "$ROOT/tools/uroce" run --mtu 2>"$WORK/run.err" || rc=$?
  expect_status 2 "$rc" "uroce run --mtu (no value)"
}

# `uroce run`'s device options reach the library as UROCE_DEVICE: --host-device insists on the host device,
# --process-device asks for one of the process's own, and neither leaves the library's default (the host device,
# falling back to one of its own) alone.
test_run_device_options() {
  local flag want got
  for flag in --host-device --process-device ""; do
    case "$flag" in --host-device) want=host ;; --process-device) want=process ;; *) want="(unset)" ;; esac
    # shellcheck disable=SC2086  # no option at all for ""
    got=$(env -u UROCE_DEVICE "$ROOT/tools/uroce" run $flag -- sh -c 'echo "${UROCE_DEVICE-(unset)}"' 2>/dev/null)
    [ "$got" = "$want" ] || fail "uroce run ${flag:-(no option)}: UROCE_DEVICE '$got', want '$want'"
  done
}

# `uroce run` never starts a program against the system's libibverbs: a copy of the commands away from any build,
# whose Bazel fails, must say why and exit non-zero without running it; so must an installed launcher whose
# libraries are gone.
test_run_refuses_without_the_libraries() {
  local fake="$WORK/no-build" rc=0
  mkdir -p "$fake/tools" "$fake/bin" "$fake/prefix/bin" "$fake/prefix/share/uroce" "$fake/prefix/lib/uroce"
  cp "$ROOT/tools/uroce" "$ROOT/tools/uroce.bash" "$fake/tools/"
  printf '#!/bin/sh\necho "bazel: cannot reach the server" >&2\nexit 37\n' >"$fake/bin/bazel"
  chmod +x "$fake/bin/bazel"
  PATH="$fake/bin:$PATH" "$fake/tools/uroce" run -- touch "$WORK/ran" >"$WORK/norun.out" 2>&1 || rc=$?
  expect_status 1 "$rc" "uroce run whose Bazel fails"
  expect_grep "^uroce: .*not starting touch" "$WORK/norun.out" "it says why"
  [ ! -e "$WORK/ran" ] || fail "the program ran without uroce's libraries"
  cp "$ROOT/tools/uroce_launcher" "$fake/prefix/bin/uroce"
  cp "$ROOT/tools/uroce.bash" "$fake/prefix/share/uroce/"
  rc=0
  "$fake/prefix/bin/uroce" run -- touch "$WORK/ran" >"$WORK/norun.out" 2>&1 || rc=$?
  expect_status 1 "$rc" "installed uroce run with no libraries"
  expect_grep "^uroce: .*not starting touch" "$WORK/norun.out" "the installed launcher says why"
  [ ! -e "$WORK/ran" ] || fail "the installed launcher ran the program without uroce's libraries"
}

# Eight programs started at once through `uroce run`, four of them in a second network namespace (where the Bazel
# server, reached over loopback TCP, cannot be reached): each opens uroce0 and finds its port active.
test_run_from_another_network_namespace() {
  if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
    skip "needs root and iproute2 to make a network namespace"; return
  fi
  NETNS="uroce-tools-$$"
  if ! ip netns add "$NETNS" 2>"$WORK/netns.err" || ! ip -n "$NETNS" link set lo up 2>>"$WORK/netns.err"; then
    skip "cannot make a network namespace: $(head -n1 "$WORK/netns.err")"; NETNS=""; return
  fi
  local rc=0 i
  "$ROOT/tools/uroce" run -- true >"$WORK/warm.out" 2>&1 || rc=$?  # builds if needed, in Bazel's namespace
  expect_status 0 "$rc" "uroce run -- true"
  local -a pids=()
  for i in 1 2 3 4; do
    "$ROOT/tools/uroce" run -- ibv_devinfo -d uroce0 >"$WORK/here$i.out" 2>&1 &
    pids+=($!)
    ip netns exec "$NETNS" "$ROOT/tools/uroce" run -- ibv_devinfo -d uroce0 >"$WORK/there$i.out" 2>&1 &
    pids+=($!)
  done
  local pid out
  for pid in "${pids[@]}"; do
    rc=0; wait "$pid" || rc=$?
    expect_status 0 "$rc" "a concurrent uroce run -- ibv_devinfo"
  done
  for out in "$WORK"/here?.out "$WORK"/there?.out; do
    expect_grep "hca_id:[[:space:]]+uroce0" "$out" "$(basename "$out" .out) lists uroce0"
    expect_grep "state:[[:space:]]+PORT_ACTIVE" "$out" "$(basename "$out" .out) opened uroce0"
  done
  ip netns del "$NETNS"; NETNS=""
}

# `uroce run --one-packet-per-datagram`: a tcpdump of lo shows every RoCE packet as a datagram of its own, and scapy's
# RoCEv2 code reproduces every ICRC. Without it, loopback carries whole UDP_SEGMENT runs, which scapy cannot read as
# one packet each (the capture is made in a network namespace of its own, so that its lo carries only this pair).
test_run_one_packet_per_datagram_for_tcpdump() {
  if [ "$(id -u)" -ne 0 ] || ! command -v tcpdump >/dev/null || ! unshare --net true 2>/dev/null; then
    skip "needs root, tcpdump and a network namespace to capture lo alone"; return
  fi
  local with="$WORK/one-per-datagram.pcap" without="$WORK/segmented.pcap"
  ROOT="$ROOT" WORK="$WORK" unshare --net bash -c '
    source "$ROOT/tools/uroce.bash"
    ip link set lo up
    capture() {  # capture FILE [uroce run options]: an ibv_rc_pingpong -s 4096 pair on lo, captured by tcpdump
      local file="$1" port
      shift
      port=$(free_tcp_port)
      tcpdump -i lo -U -w "$file" udp port 4791 2>"$file.log" &
      local dump=$!
      for _ in $(seq 1 100); do grep -q "listening on" "$file.log" && break; sleep 0.05; done
      "$ROOT/tools/uroce" run "$@" -- ibv_rc_pingpong -g 0 -c -s 4096 -n 50 -p "$port" >"$file.server" 2>&1 &
      local server=$!
      wait_listening "$port" "$server"
      "$ROOT/tools/uroce" run "$@" -- ibv_rc_pingpong -g 0 -c -s 4096 -n 50 -p "$port" 127.0.0.1 >"$file.client" 2>&1
      wait "$server"
      sleep 0.2
      kill -INT "$dump"; wait "$dump"
    }
    capture "'"$with"'" --one-packet-per-datagram
    capture "'"$without"'"'
  local out rc=0
  out=$(/usr/bin/python3 "$ROOT/tests/scapy_icrc_check.py" "$with") || rc=$?
  expect_status 0 "$rc" "scapy checks every ICRC of the capture with --one-packet-per-datagram ($out)"
  [[ "$out" =~ ^packets\ ([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 400 ] ||
    fail "only '$out' in the capture: 50 round trips of 4 packets each, and their ACKs, expected"
  out=$(/usr/bin/python3 "$ROOT/tests/scapy_icrc_check.py" "$without") || true
  [[ "$out" =~ superdatagrams\ ([1-9][0-9]*) ]] ||
    fail "without the switch lo carries UDP_SEGMENT runs whole, but the capture shows none ($out): the case proves nothing"
}

# Every counter `uroce run --stats` prints is explained in the README's counters table.
test_readme_explains_every_counter() {
  local rc=0 name missing=""
  "$ROOT/tools/uroce" run --stats --loss 0 -- ibv_devinfo >"$WORK/stats.out" 2>&1 || rc=$?  # --loss: faults_ lines
  expect_status 0 "$rc" "uroce run --stats --loss 0 -- ibv_devinfo"
  expect_grep "^rx_packets [0-9]+$" "$WORK/stats.out" "the counters are printed"
  expect_grep "^faults_send seen " "$WORK/stats.out" "the fault counters are printed"
  awk '/^### Counters/ {on = 1; next} /^#/ {on = 0} on' "$ROOT/README.md" >"$WORK/counters.md"
  while read -r name; do
    grep -qF -- "\`$name\`" "$WORK/counters.md" || missing+=" $name"
  done < <(awk '/^[a-z_]+ [0-9]+$/ {print $1} /^faults_(send|receive) seen / {print $1}' "$WORK/stats.out")
  [ -z "$missing" ] || fail "counters the README's table does not name:$missing"
}

test_install_refuses_the_system_library_path() {
  local prefix rc
  for prefix in / /usr /usr/local; do
    rc=0
    "$ROOT/tools/uroce" install --prefix "$prefix" 2>"$WORK/install.err" || rc=$?
    expect_status 1 "$rc" "uroce install --prefix $prefix"
    expect_grep "refusing --prefix" "$WORK/install.err" "--prefix $prefix is refused"
  done
}

# An install moved away from where it was made runs ibv_devinfo and an RC pingpong pair (data checked with -c) in
# a clean environment, and decodes the pair's capture.
test_install_works_away_from_the_checkout() {
  local rc=0
  "$ROOT/tools/uroce" install --prefix "$WORK/made" >"$WORK/install.log" 2>&1 || rc=$?
  expect_status 0 "$rc" "uroce install --prefix $WORK/made"
  [ "$rc" -eq 0 ] || { sed 's/^/      | /' "$WORK/install.log" >&2; return; }
  [ -x "$WORK/made/lib/uroce/libibverbs.so.1" ] || fail "no lib/uroce/libibverbs.so.1"
  mv "$WORK/made" "$WORK/moved"
  local prefix="$WORK/moved"
  local -a clean_env=(env -i "PATH=/usr/bin:/bin" "HOME=$WORK" UROCE_DEVICE=process)
  rc=0
  (cd / && "${clean_env[@]}" "$prefix/bin/uroce" run --mtu 2048 -- ibv_devinfo) >"$WORK/devinfo.out" 2>&1 || rc=$?
  expect_status 0 "$rc" "installed uroce run -- ibv_devinfo"
  expect_grep "hca_id:[[:space:]]+uroce0" "$WORK/devinfo.out" "installed ibv_devinfo lists uroce0"
  expect_grep "active_mtu:[[:space:]]+2048" "$WORK/devinfo.out" "installed --mtu 2048 applied"

  local port
  port=$(free_tcp_port)
  local -a pingpong=(ibv_rc_pingpong -g 0 -c -n 50 -s 4096 -p "$port")
  (cd "$WORK" && exec "${clean_env[@]}" timeout 60 "$prefix/bin/uroce" run -- "${pingpong[@]}") \
    >"$WORK/server.out" 2>&1 &
  SERVER_PID=$!
  if ! wait_listening "$port" "$SERVER_PID"; then
    fail "pingpong server did not listen"; sed 's/^/      | /' "$WORK/server.out" >&2; return
  fi
  rc=0
  (cd "$WORK" && "${clean_env[@]}" timeout 60 "$prefix/bin/uroce" run --pcap "$WORK/client.pcap" -- \
    "${pingpong[@]}" 127.0.0.1) >"$WORK/client.out" 2>&1 || rc=$?
  expect_status 0 "$rc" "installed pingpong client"
  local server_rc=0
  wait "$SERVER_PID" || server_rc=$?
  SERVER_PID=""
  expect_status 0 "$server_rc" "installed pingpong server"
  expect_grep "50 iters" "$WORK/client.out" "client completed 50 iterations"
  expect_grep "50 iters" "$WORK/server.out" "server completed 50 iterations"
  rc=0
  "${clean_env[@]}" "$prefix/bin/uroce" decode "$WORK/client.pcap" >"$WORK/decode.out" 2>&1 || rc=$?
  expect_status 0 "$rc" "installed uroce decode"
  expect_grep "RC_SEND.*icrc=ok" "$WORK/decode.out" "the capture decodes as RC sends with good ICRCs"
}

cases=("$@")
[ ${#cases[@]} -gt 0 ] || mapfile -t cases < <(declare -F | sed -n 's/^declare -f test_/test_/p')
passed=0 failed=0 skipped=0
for name in "${cases[@]}"; do
  case_ok=1 case_skipped=""
  echo "[tools] $name" >&2
  if declare -F "$name" >/dev/null; then "$name"; else fail "no such case"; fi
  if [ "$case_ok" != 1 ]; then failed=$((failed + 1))
  elif [ -n "$case_skipped" ]; then
    skipped=$((skipped + 1)); echo "    SKIPPED: $case_skipped" >&2
    echo "[tools] SKIPPED $name: $case_skipped"  # for the suite's summary
  else passed=$((passed + 1)); echo "    ok" >&2; fi
done
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"
else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
