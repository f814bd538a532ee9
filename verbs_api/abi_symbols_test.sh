#!/usr/bin/env bash
# ABI test of our drop-in libibverbs.so.1 against the Debian 12 (rdma-core v44) programs that will load it.
#
# usage: abi_symbols_test.sh PATH/TO/libibverbs.so.1   (Bazel passes $(location :libibverbs.so.1))
#
# Checks, one JUnit test case each (written to $XML_OUTPUT_FILE, so tests/junit_count.py counts them):
#   soname                 SONAME is libibverbs.so.1;
#   no_real_rdma_libs      no DT_NEEDED on libibverbs / librdmacm / a provider (we replace them, never wrap them);
#   version_nodes          IBVERBS_1.0 .. 1.14 chained as rdma-core chains them, IBVERBS_PRIVATE_34, and uroce's
#                          own UROCE_PRIVATE_1 (the engine's interface for our librdmacm);
#   real_library_exports   every default (@@) symbol of the real libibverbs.so.1 is exported by ours in the same node
#                          (read with readelf only; the real library is never loaded);
#   imports:<file>         every libibverbs symbol@version the file imports is exported by ours as name@@version, for
#                          each binary of ibverbs-utils, perftest and rdmacm-utils, librdmacm, every provider library
#                          and every pyverbs extension module (missing files are skipped);
#   resolves:<binary>      `ldd -r` with LD_LIBRARY_PATH=<our dir> finds our copy and reports no missing symbol or
#                          version (the loader's own check, without running the program);
#   no_fallback_answers    no public function is still answered by its weak fallback (fallback_symbols.cc) unless
#                          README.md's line "Weak fallbacks still exported" names it (README passed as $2);
#   loads:ibv_devices, loads:ib_send_bw_-h, loads:pyverbs_import
#                          the program runs with our library and the loader prints no "symbol lookup error" /
#                          "version ... not found" / "undefined symbol" (exit status and output are not judged: there is
#                          no device yet).
set -uo pipefail

ours_in="${1:?usage: abi_symbols_test.sh PATH/TO/libibverbs.so.1 README.md}"
readme="${2:?usage: abi_symbols_test.sh PATH/TO/libibverbs.so.1 README.md}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}/abi"
mkdir -p "$tmp/lib"
cp "$ours_in" "$tmp/lib/libibverbs.so.1"
ours="$tmp/lib/libibverbs.so.1"

REAL_LIB=/usr/lib/x86_64-linux-gnu/libibverbs.so.1
PY=/usr/bin/python3

# Debian 12 clients (ibverbs-utils, perftest, rdmacm-utils) and libraries that import libibverbs symbols.
CLIENT_BINARIES=(
  /usr/bin/ibv_asyncwatch /usr/bin/ibv_devices /usr/bin/ibv_devinfo
  /usr/bin/ibv_rc_pingpong /usr/bin/ibv_srq_pingpong /usr/bin/ibv_uc_pingpong /usr/bin/ibv_ud_pingpong
  /usr/bin/ibv_xsrq_pingpong
  /usr/bin/ib_atomic_bw /usr/bin/ib_atomic_lat /usr/bin/ib_read_bw /usr/bin/ib_read_lat /usr/bin/ib_send_bw
  /usr/bin/ib_send_lat /usr/bin/ib_write_bw /usr/bin/ib_write_lat /usr/bin/raw_ethernet_burst_lat
  /usr/bin/raw_ethernet_bw /usr/bin/raw_ethernet_fs_rate /usr/bin/raw_ethernet_lat
  /usr/bin/cmtime /usr/bin/mckey /usr/bin/rcopy /usr/bin/rdma_client /usr/bin/rdma_server /usr/bin/rdma_xclient
  /usr/bin/rdma_xserver /usr/bin/riostream /usr/bin/rping /usr/bin/rstream /usr/bin/ucmatose /usr/bin/udaddy
  /usr/bin/udpong
)
CLIENT_LIBRARIES=(
  /usr/lib/x86_64-linux-gnu/librdmacm.so.1
  /usr/lib/x86_64-linux-gnu/libmlx5.so.1 /usr/lib/x86_64-linux-gnu/libmlx4.so.1
  /usr/lib/x86_64-linux-gnu/libefa.so.1 /usr/lib/x86_64-linux-gnu/libmana.so.1
  /usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
)
shopt -s nullglob
CLIENT_LIBRARIES+=(/usr/lib/x86_64-linux-gnu/libibverbs/*.so)
PYVERBS_MODULES=(/usr/lib/python3/dist-packages/pyverbs/*.so /usr/lib/python3/dist-packages/pyverbs/providers/*/*.so)
shopt -u nullglob

LOADER_ERRORS='symbol lookup error|version `?IBVERBS[^ ]*'"'"'? not found|undefined symbol|cannot open shared object'

# From the runfiles root (Bazel's working directory for a test), or the checkout's when run by hand.
# shellcheck source=tests/junit.bash
source tests/junit.bash
pass() { junit_pass "$1"; }
skip() { junit_skip "$1" "$2"; }
fail() { junit_fail "$1" "$2"; }
check() { junit_check "$1" "$2"; }

# "name@@NODE" for every versioned default definition of a shared object.
default_exports() {
  readelf --dyn-syms -W "$1" | awk '$7 != "UND" && $8 ~ /@@/ { print $8 }' | sort -u
}
# "name@NODE" for every IBVERBS_* symbol a file imports.
ibverbs_imports() {
  readelf --dyn-syms -W "$1" | awk '$7 == "UND" && $8 ~ /@IBVERBS_/ { print $8 }' | sort -u
}

ours_exports="$tmp/ours_exports"
default_exports "$ours" >"$ours_exports"

# --- the library itself ---
soname=$(readelf -d "$ours" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
check soname "$([ "$soname" = libibverbs.so.1 ] || echo "SONAME is '$soname', want libibverbs.so.1")"

needed=$(readelf -d "$ours" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
bad_needed=$(grep -E '^lib(ibverbs|rdmacm|mlx[45]|efa|mana|ibumad)\.so|rdmav[0-9]+\.so' <<<"$needed")
check no_real_rdma_libs "$([ -z "$bad_needed" ] || printf 'DT_NEEDED on the real RDMA libraries:\n%s' "$bad_needed")"

# rdma-core's node chain (readelf -V of the real library): each IBVERBS_1.x has the previous as parent.
expected_nodes=$'IBVERBS_1.0 -\nIBVERBS_1.1 IBVERBS_1.0\nIBVERBS_1.5 IBVERBS_1.1\nIBVERBS_1.6 IBVERBS_1.5
IBVERBS_1.7 IBVERBS_1.6\nIBVERBS_1.8 IBVERBS_1.7\nIBVERBS_1.9 IBVERBS_1.8\nIBVERBS_1.10 IBVERBS_1.9
IBVERBS_1.11 IBVERBS_1.10\nIBVERBS_1.12 IBVERBS_1.11\nIBVERBS_1.13 IBVERBS_1.12\nIBVERBS_1.14 IBVERBS_1.13
IBVERBS_PRIVATE_34 -
UROCE_PRIVATE_1 -'
version_nodes() {  # "NODE PARENT" per version definition, "-" for none; the BASE entry (the soname) left out
  readelf -V "$1" | awk '
    /^Version definition/ { in_def = 1; next }
    /^Version (needs|symbols)/ { in_def = 0 }
    in_def && /Name:/ { if (node != "") print node, parent; node = $NF; parent = "-"; base = /BASE/; if (base) node = "" }
    in_def && /Parent 1:/ && node != "" { parent = $NF }
    END { if (node != "") print node, parent }'
}
actual_nodes=$(version_nodes "$ours")
check version_nodes "$(diff <(sort <<<"$expected_nodes") <(sort <<<"$actual_nodes") | sed 's/^/  /')"

if [ -r "$REAL_LIB" ]; then
  missing=$(comm -23 <(default_exports "$REAL_LIB") "$ours_exports")
  check real_library_exports "$([ -z "$missing" ] || printf 'exported by %s but not by ours:\n%s' "$REAL_LIB" "$missing")"
else
  skip real_library_exports "$REAL_LIB not installed"
fi

# Weak definitions left in the library are the generated fallbacks: a real call would get EOPNOTSUPP from a function
# nobody implemented. Only those README.md names (on its line "Weak fallbacks still exported") may remain.
weak=$(readelf --dyn-syms -W "$ours" | awk '$5 == "WEAK" && $7 != "UND" && $8 ~ /@@IBVERBS/ {sub(/@@.*/, "", $8); print $8}' |
  sort -u)
allowed=$(grep -m1 '^Weak fallbacks still exported' "$readme" | grep -o '`[a-z_0-9]*`' | tr -d '`' | sort -u)
unlisted=$(comm -23 <(printf '%s\n' "$weak" | sed '/^$/d') <(printf '%s\n' "$allowed" | sed '/^$/d'))
check no_fallback_answers "$([ -z "$unlisted" ] || printf 'answered by a weak fallback, not named by README:\n%s' "$unlisted")"

# --- what each client imports ---
for f in "${CLIENT_BINARIES[@]}" "${CLIENT_LIBRARIES[@]}" "${PYVERBS_MODULES[@]}"; do
  name="imports:${f#/usr/}"
  if [ ! -e "$f" ]; then skip "$name" "not installed"; continue; fi
  missing=$(comm -23 <(ibverbs_imports "$f" | sed 's/@/@@/') "$ours_exports" | sed 's/@@/@/')
  check "$name" "$([ -z "$missing" ] || printf 'imported but not exported by ours in that node:\n%s' "$missing")"
done

# --- the loader's own verdict, without running the programs ---
for f in "${CLIENT_BINARIES[@]}"; do
  name="resolves:$(basename "$f")"
  if [ ! -e "$f" ]; then skip "$name" "not installed"; continue; fi
  out=$(LD_LIBRARY_PATH="$tmp/lib" ldd -r "$f" 2>&1)
  problems=$(grep -E "$LOADER_ERRORS" <<<"$out")
  if ! grep -q "libibverbs.so.1 => $tmp/lib/libibverbs.so.1" <<<"$out"; then
    problems+=$'\n'"libibverbs.so.1 was not resolved to our copy:"$'\n'"$(grep libibverbs <<<"$out")"
  fi
  check "$name" "$problems"
done

# --- real loads ---
# A sanitizer build of our library (--config=asan / tsan) needs its runtime loaded before everything else, as a
# sanitized program would have it; leaks of the (unsanitized) client programs are not ours to judge here.
sanitizer_runtime=$(ldd "$ours" | awk '$1 ~ /^lib(asan|tsan|ubsan|lsan)\.so/ && $3 ~ /^\// { print $3 }' | paste -sd:)
load_env=(LD_LIBRARY_PATH="$tmp/lib")
if [ -n "$sanitizer_runtime" ]; then
  load_env+=(LD_PRELOAD="$sanitizer_runtime" ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
fi
load_check() {  # load_check NAME COMMAND...: runs it with our library first on the search path
  local name="$1"; shift
  if [ ! -e "$1" ]; then skip "$name" "$1 not installed"; return; fi
  local out
  out=$(cd "$tmp" && env "${load_env[@]}" timeout 20 "$@" 2>&1 </dev/null)
  local rc=$?
  local problems
  problems=$(grep -E "$LOADER_ERRORS" <<<"$out")
  if [ "$rc" -ge 124 ]; then problems+=$'\n'"exit status $rc (timeout, loader failure or signal):"$'\n'"$out"; fi
  check "$name" "$problems"
}
load_check loads:ibv_devices /usr/bin/ibv_devices
load_check loads:ib_send_bw_-h /usr/bin/ib_send_bw -h
if [ -d /usr/lib/python3/dist-packages/pyverbs ] && [ -x "$PY" ]; then
  # Python dlopens extension modules with RTLD_NOW, so a missing symbol or version fails the import.
  modules=$(cd /usr/lib/python3/dist-packages && for m in "${PYVERBS_MODULES[@]}"; do
    m=${m#/usr/lib/python3/dist-packages/}; m=${m%%.cpython*}; printf '%s ' "${m//\//.}"; done)
  load_check loads:pyverbs_import "$PY" -c "
import importlib, sys
for m in '$modules'.split():
    importlib.import_module(m)
print('imported', len('$modules'.split()), 'pyverbs modules')"
else
  skip loads:pyverbs_import "python3-pyverbs not installed"
fi

# --- report ---
junit_report verbs_api.abi_symbols_test
