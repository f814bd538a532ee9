#!/usr/bin/env bash
# The suite's smoke run of `tools/uroce bench vs-rxe` (tools/uroce.bash, uroce_vs_rxe): one short round of the four
# perftest pairs over the kernel's rxe and over uroce in the QEMU/TCG guest, the table printed. It checks that every
# pair finished and gave a figure; it asserts no timing (figures come from `tools/uroce bench vs-rxe`, medians of 3
# rounds). Skips with the reason where the guest cannot be had (not root, a tool missing, no network for a cold
# build), as the interop test does. usage (by Bazel): vs_rxe_smoke_test.sh
set -uo pipefail

# shellcheck source=tests/junit.bash
source tests/junit.bash
# shellcheck source=tools/uroce.bash
source tools/uroce.bash

main() {
  local name="vs_rxe_quick_round" work guest rc=0 out
  work="${TEST_TMPDIR:-$(mktemp -d)}/vs_rxe"
  rm -rf "$work"
  mkdir -p "$work/prefix/lib/uroce"
  if [ "$(id -u)" -ne 0 ]; then
    junit_skip "$name" "building the guest needs root"
  elif ! command -v qemu-system-x86_64 >/dev/null; then
    junit_skip "$name" "qemu-system-x86_64 is not installed (tools/uroce setup installs qemu-system-x86)"
  else
    # The guest's cache, as the interop test finds it: $UROCE_GUEST_CACHE, else ~/.cache of the user (Bazel gives tests
    # no HOME).
    local cache="${UROCE_GUEST_CACHE:-$(getent passwd "$(id -u)" | cut -d: -f6)/.cache/uroce-rxe-guest}"
    guest=$(tests/interop/build_guest.sh "$cache" 2>"$work/build.log") || rc=$?
    if [ "$rc" -eq 2 ] || [ "$rc" -eq 3 ]; then
      junit_skip "$name" "no guest: $(tail -n 1 "$work/build.log")"
    elif [ "$rc" -ne 0 ]; then
      junit_fail "$name" "build_guest.sh failed ($rc): $(tail -n 5 "$work/build.log")"
    else
      cp verbs_api/libibverbs.so.1 verbs_api/librdmacm.so.1 verbs_api/liburoce_preload.so service/uroce-deviced \
        "$work/prefix/lib/uroce/"
      rc=0
      out=$(uroce_vs_rxe "$guest" "$work/prefix" 1 1 tools/uroce_bench 2>&1) || rc=$?
      printf '%s\n' "$out"
      local problems=""
      [ "$rc" -eq 0 ] || problems+="the run failed ($rc): $(tail -n 8 <<<"$out")"$'\n'
      local figure
      for figure in ib_write_bw ib_read_bw ib_send_lat ib_write_lat; do
        # Both columns hold a figure above 0 (a pair that gave none shows 0.00).
        grep -E "^  $figure \(" <<<"$out" | awk '{exit !($(NF - 4) > 0 && $(NF - 2) > 0)}' ||
          problems+="no figure for $figure from both rxe and uroce"$'\n'
      done
      junit_check "$name" "$problems"
    fi
  fi
  junit_report vs_rxe_smoke_test
}

main "$@"
