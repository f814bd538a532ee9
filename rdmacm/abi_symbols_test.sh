#!/usr/bin/env bash
# ABI test of our drop-in librdmacm.so.1 against rdma-core v44's (Debian 12), read with readelf only (the real
# library is never loaded), and against the Debian programs that load it.
#
# usage: abi_symbols_test.sh PATH/TO/librdmacm.so.1 PATH/TO/libibverbs.so.1
#
# Checks, one JUnit case each (in $XML_OUTPUT_FILE):
#   soname          SONAME librdmacm.so.1, DT_NEEDED libibverbs.so.1 and no other RDMA library;
#   version_nodes   RDMACM_1.0 .. 1.3 chained as rdma-core chains them;
#   exports         exactly the real library's default (@@) symbols, each in its node (68 functions);
#   resolves:<bin>  `ldd -r` of each rdmacm-utils / perftest program with our directory first reports no missing
#                   symbol or version and finds both of our libraries.
set -uo pipefail

ours_in="${1:?usage: abi_symbols_test.sh librdmacm.so.1 libibverbs.so.1}"
verbs_in="${2:?}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}/rdmacm_abi"
mkdir -p "$tmp/lib"
cp "$ours_in" "$tmp/lib/librdmacm.so.1"
cp "$verbs_in" "$tmp/lib/libibverbs.so.1"
ours="$tmp/lib/librdmacm.so.1"
REAL=/usr/lib/x86_64-linux-gnu/librdmacm.so.1

cases=() failures=0
check() {  # check NAME MESSAGE-IF-FAILED (empty: passed)
  if [ -z "$2" ]; then cases+=("<testcase classname=\"rdmacm_abi\" name=\"$1\"/>"); echo "PASS $1"
  else cases+=("<testcase classname=\"rdmacm_abi\" name=\"$1\"><failure message=\"failed\"><![CDATA[$2]]></failure></testcase>")
       echo "FAIL $1"; echo "$2" | sed 's/^/  /'; failures=$((failures + 1)); fi
}
skip() { cases+=("<testcase classname=\"rdmacm_abi\" name=\"$1\"><skipped message=\"$2\"/></testcase>"); echo "SKIP $1: $2"; }

default_exports() {  # name@@NODE of every defined default-version function symbol
  readelf --dyn-syms -W "$1" | awk '$7 != "UND" && $4 == "FUNC" && $8 ~ /@@/ { print $8 }' | sort -u
}

soname=$(readelf -d "$ours" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
needed=$(readelf -d "$ours" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
msg=""
[ "$soname" = librdmacm.so.1 ] || msg+="SONAME is '$soname'"$'\n'
grep -qx libibverbs.so.1 <<<"$needed" || msg+="no DT_NEEDED libibverbs.so.1"$'\n'
bad=$(grep -E '^lib(rdmacm|mlx[45]|efa|ibumad|nl-)' <<<"$needed")
[ -z "$bad" ] || msg+="DT_NEEDED on: $bad"$'\n'
check soname "$msg"

nodes=$(readelf -V "$ours" | awk '/^Version definition/ {d=1; next} /^Version (needs|symbols)/ {d=0}
  d && /Name:/ { if (n != "") print n, p; n = $NF; p = "-"; if (/BASE/) n = "" }
  d && /Parent 1:/ && n != "" { p = $NF } END { if (n != "") print n, p }')
want=$'RDMACM_1.0 -\nRDMACM_1.1 RDMACM_1.0\nRDMACM_1.2 RDMACM_1.1\nRDMACM_1.3 RDMACM_1.2'
check version_nodes "$(diff <(sort <<<"$want") <(sort <<<"$nodes"))"

ours_exports=$(default_exports "$ours")
count=$(wc -l <<<"$ours_exports")
if [ -r "$REAL" ]; then
  d=$(diff <(default_exports "$REAL") <(echo "$ours_exports"))
  check exports "$([ -z "$d" ] || printf '< real only, > ours only:\n%s' "$d")"
else
  check exports "$([ "$count" = 68 ] || echo "$count default exports, want 68")"
fi

for b in rping ucmatose udaddy mckey rdma_server rdma_client rdma_xserver rdma_xclient cmtime rstream riostream \
         udpong rcopy ib_send_bw ib_write_bw ib_read_bw ib_read_lat; do
  f=/usr/bin/$b
  if [ ! -x "$f" ]; then skip "resolves:$b" "not installed"; continue; fi
  out=$(LD_LIBRARY_PATH="$tmp/lib" ldd -r "$f" 2>&1)
  msg=$(grep -E "undefined symbol|not found|version .* not found" <<<"$out")
  grep -q "librdmacm.so.1 => $tmp/lib/librdmacm.so.1" <<<"$out" || msg+=$'\n'"does not load our librdmacm"
  grep -q "libibverbs.so.1 => $tmp/lib/libibverbs.so.1" <<<"$out" || msg+=$'\n'"does not load our libibverbs"
  check "resolves:$b" "$(sed '/^$/d' <<<"$msg")"
done

if [ -n "${XML_OUTPUT_FILE:-}" ]; then
  { echo "<?xml version=\"1.0\"?><testsuites><testsuite name=\"rdmacm_abi\" tests=\"${#cases[@]}\" failures=\"$failures\">"
    printf '%s\n' "${cases[@]}"; echo "</testsuite></testsuites>"; } >"$XML_OUTPUT_FILE"
fi
[ "$failures" = 0 ]
