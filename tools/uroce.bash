# Shell functions shared by the checkout's tools/uroce, the launcher `tools/uroce install` puts in PREFIX/bin/uroce
# (tools/uroce_launcher, which finds this file in PREFIX/share/uroce), and tests/tools_test.sh. Sourced, not run.

# The options of `uroce run`, for the usage texts of both commands.
uroce_run_options_help() {
  cat <<'HELP'
      --addr IP         pin the device's address (default: the host's address, see README; with
                        --process-device the first free of 127.0.0.1 ... 127.0.255.254)
      --host-device     share the host device of the address with every other process of this network namespace,
                        through the host's device service, or fail (the default shares it when it can, else
                        gives the process a device of its own)
      --process-device  a device of the process's own on an address of its own (UROCE_DEVICE=process)
      --same-host P     on the host device, how packets between its processes travel: shm (shared-memory rings,
                        the default), unix (UNIX sockets), udp (real UDP to UDP 4791, for tcpdump)
      --no-direct       on the host device, RDMA WRITE and READ between its processes go as packets too (by
                        default, on the shm path without capture or faults, the initiator carries them out in the
                        target's registered memory)
      --mtu N           active MTU: 256, 512, 1024, 2048, 4096 (default: the interface's, at most 4096)
      --pcap FILE       record every packet sent and received
      --stats           print the device's counters (drops by reason, retransmissions, faults) at exit
      --trace           print the protocol's decisions as they happen: which check of a request or response
                        decided what, what each timer did (one line each on stderr)
      --transport T     uring or socket (default: io_uring, plain sockets where io_uring is refused)
      --one-packet-per-datagram
                        no UDP segmentation offload: tcpdump then shows each RoCE packet as a datagram of its own
      --loss P --dup P --reorder P --corrupt P --delay-us N --seed S
                        deterministic fault injection on this process's packets
HELP
}

# uroce_parse_run_options [OPTIONS] -- COMMAND [ARGS...]: sets RUN_ENV (NAME=VALUE settings for the library, see
# README's options table) and RUN_COMMAND. Exits 2 with a message on a usage error, 0 after printing help for -h.
uroce_parse_run_options() {
  RUN_ENV=()
  RUN_COMMAND=()
  local -a faults=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --) shift; break ;;
      --stats) RUN_ENV+=("UROCE_STATS=1"); shift; continue ;;
      --host-device) RUN_ENV+=("UROCE_DEVICE=host"); shift; continue ;;
      --process-device) RUN_ENV+=("UROCE_DEVICE=process"); shift; continue ;;
      --trace) RUN_ENV+=("UROCE_TRACE=1"); shift; continue ;;
      --one-packet-per-datagram) RUN_ENV+=("UROCE_ONE_PACKET_PER_DATAGRAM=1"); shift; continue ;;
      --no-direct) RUN_ENV+=("UROCE_DIRECT=0"); shift; continue ;;
      -h|--help)
        echo "usage: uroce run [options] -- COMMAND [ARGS...]"
        uroce_run_options_help
        exit 0 ;;
      --addr|--mtu|--pcap|--transport|--same-host|--loss|--dup|--reorder|--corrupt|--delay-us|--seed)
        [ $# -ge 2 ] || { echo "uroce run: $1 needs a value" >&2; exit 2; } ;;
      *) echo "uroce run: unknown option $1 (options go before --)" >&2; exit 2 ;;
    esac
    case "$1" in
      --addr) RUN_ENV+=("UROCE_ADDR=$2") ;;
      --mtu) RUN_ENV+=("UROCE_MTU=$2") ;;
      --pcap) RUN_ENV+=("UROCE_PCAP=$2") ;;
      --transport) RUN_ENV+=("UROCE_TRANSPORT=$2") ;;
      --same-host) RUN_ENV+=("UROCE_SAME_HOST=$2") ;;
      --loss) faults+=("loss=$2") ;;
      --dup) faults+=("dup=$2") ;;
      --reorder) faults+=("reorder=$2") ;;
      --corrupt) faults+=("corrupt=$2") ;;
      --delay-us) faults+=("delay_us=$2") ;;
      --seed) faults+=("seed=$2") ;;
    esac
    shift 2
  done
  [ $# -ge 1 ] || { echo "usage: uroce run [options] -- COMMAND [ARGS...]" >&2; exit 2; }
  if [ "${#faults[@]}" -gt 0 ]; then
    local IFS=,
    RUN_ENV+=("UROCE_FAULTS=${faults[*]}")
  fi
  RUN_COMMAND=("$@")
}

# The libraries a program runs with: the drop-in libibverbs and librdmacm, and the discovery shim that shows uroce0
# in /sys/class/infiniband and /dev/infiniband (verbs_api/discovery_preload.c).
UROCE_LIBS=(libibverbs.so.1 librdmacm.so.1 liburoce_preload.so)

# uroce_has_drop_in_libs DIR: whether DIR holds every one of UROCE_LIBS.
uroce_has_drop_in_libs() {
  [ -n "$1" ] || return 1
  local lib
  for lib in "${UROCE_LIBS[@]}"; do [ -r "$1/$lib" ] || return 1; done
}

# uroce_exec_run LIB_DIR: replaces the shell with RUN_COMMAND, LIB_DIR first on the library path, the discovery shim
# preloaded and RUN_ENV set, in the caller's working directory; its exit status is the program's. Without uroce's
# libraries in LIB_DIR the program would load the system's libibverbs (no device): it says so and exits 1 instead.
uroce_exec_run() {
  if ! uroce_has_drop_in_libs "$1"; then
    printf "uroce: not starting %s: uroce's libraries (%s) are not in '%s'\n" \
      "${RUN_COMMAND[0]}" "${UROCE_LIBS[*]}" "$1" >&2
    exit 1
  fi
  exec env "LD_LIBRARY_PATH=$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "LD_PRELOAD=$1/liburoce_preload.so${LD_PRELOAD:+:$LD_PRELOAD}" "${RUN_ENV[@]}" "${RUN_COMMAND[@]}"
}

# uroce_stats [PID...]: the counters of running programs started by `uroce run` (all of this user's, or those PIDs),
# as UROCE_STATS prints them at exit, refreshed every half second while each has traffic. They live in the folder
# the discovery shim makes per process (verbs_api/discovery_preload.c: <base>/<pid>.<start time>/counters).
uroce_stats() {
  local base="${UROCE_DEVICE_TREE:-${XDG_RUNTIME_DIR:-${TMPDIR:-/tmp}}/uroce-$(id -u)}" dir pid found=0
  for dir in "$base"/*.*/; do
    dir=${dir%/}
    pid=$(basename "$dir"); pid=${pid%%.*}
    [ -r "$dir/counters" ] && [ -d "/proc/$pid" ] || continue
    if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$pid"; then continue; fi
    found=1
    printf '== pid %s: %s\n' "$pid" "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
    cat "$dir/counters"
  done
  [ "$found" = 1 ] || { echo "uroce stats: no running program of $(id -un) started by uroce run${1:+ with pid $*}" >&2; return 1; }
}

free_tcp_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_listening() {  # wait_listening PORT PID: until a socket listens on PORT (no probe connection: the
  local hex            # pingpong servers accept exactly one), or the process is gone
  hex=$(printf ':%04X ' "$1")
  for _ in $(seq 1 200); do
    grep -q "$hex.* 0A " /proc/net/tcp 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# wait_listening_in NAMESPACE PORT PID: wait_listening, reading the network namespace's /proc/net/tcp.
wait_listening_in() {
  ip netns exec "$1" bash -c 'source "$1" && wait_listening "$2" "$3"' _ "${BASH_SOURCE[0]}" "$2" "$3"
}

# two_hosts_up NAME: two network namespaces NAME-a and NAME-b joined by a veth pair (MTU 1500), each a "host" with one
# address in a random 10.x.y.0/24; sets HOST_A, HOST_B, ADDR_A, ADDR_B and the veth's ends VETH_A, VETH_B. Fails
# (root only), with TWO_HOSTS_ERROR saying why, when they cannot be made. two_hosts_down removes them.
two_hosts_up() {
  HOST_A="$1-a" HOST_B="$1-b" VETH_A="veth-$$-a" VETH_B="veth-$$-b"
  local net="10.$((RANDOM % 200 + 20)).$((RANDOM % 250))"
  ADDR_A="$net.1" ADDR_B="$net.2"
  TWO_HOSTS_ERROR=$({ ip netns add "$HOST_A" && ip netns add "$HOST_B" &&
    ip link add "$VETH_A" netns "$HOST_A" type veth peer name "$VETH_B" netns "$HOST_B" &&
    ip -n "$HOST_A" addr add "$ADDR_A/24" dev "$VETH_A" && ip -n "$HOST_B" addr add "$ADDR_B/24" dev "$VETH_B" &&
    ip -n "$HOST_A" link set lo up && ip -n "$HOST_B" link set lo up &&
    ip -n "$HOST_A" link set "$VETH_A" up && ip -n "$HOST_B" link set "$VETH_B" up; } 2>&1) || {
    two_hosts_down
    return 1
  }
}
two_hosts_down() { ip netns del "$HOST_A" 2>/dev/null; ip netns del "$HOST_B" 2>/dev/null; }

# Medians and ranges of the figures given as arguments (the benches' reports).
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
range() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {print lo "-" hi}'; }

# uroce_vs_rxe GUEST_DIR PREFIX ROUNDS QUICK [UROCE_BENCH]: `uroce bench vs-rxe` once the guest
# (tests/interop/build_guest.sh's directory) and an install of uroce (PREFIX/lib/uroce: the drop-in libraries and the
# device service) are there: boots the guest under TCG with 2 vCPUs, PREFIX as its /opt/uroce and
# tools/vs_rxe_guest.sh (beside this file) as its program, and prints the table. UROCE_BENCH (tools:uroce_bench) goes
# into the guest too, for the latency floor beside each uroce pair. The guest's network is QEMU's user mode,
# restricted: nothing leaves it. Fails when the guest does not finish or a pair failed.
uroce_vs_rxe() {
  local guest="$1" prefix="$2" rounds="$3" quick="$4" floor_bench="${5:-}" work rc=0 script
  script="$(dirname "${BASH_SOURCE[0]}")/vs_rxe_guest.sh"
  work=$(mktemp -d)
  mkdir -p "$work/root/opt/uroce/lib" "$work/root/opt/uroce/bin"
  cp -r "$prefix/lib/uroce" "$work/root/opt/uroce/lib/"
  [ -z "$floor_bench" ] || install -m 0755 "$floor_bench" "$work/root/opt/uroce/bin/uroce_bench"
  install -m 0755 "$script" "$work/root/vs-rxe.sh"
  (cd "$work/root" && find . | LC_ALL=C sort | cpio --quiet -o -H newc) >"$work/overlay.cpio"
  cat "$guest/initramfs.cpio" "$work/overlay.cpio" >"$work/initramfs.cpio"  # the later archive adds to the first
  echo "uroce: booting the guest (TCG, 2 vCPUs): $rounds round(s) of 4 perftest pairs over rxe and over uroce" >&2
  timeout 5400 qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 1024 -nodefaults -no-reboot -display none \
    -serial "file:$work/console.log" -kernel "$guest/vmlinux" -initrd "$work/initramfs.cpio" \
    -append "console=ttyS0 panic=-1 quiet uroce_addr=10.0.2.15/24 uroce_mtu=9000 uroce_run=/vs-rxe.sh uroce_rounds=$rounds uroce_quick=$quick" \
    -netdev user,id=n0,restrict=on -device virtio-net-pci,netdev=n0,romfile= </dev/null || rc=$?
  if ! grep -q '^uroce-guest: done' "$work/console.log"; then
    echo "uroce: the guest did not finish (qemu exit $rc); its console:" >&2
    tail -n 30 "$work/console.log" >&2
    rm -rf "$work"
    return 1
  fi
  grep '^vs-rxe: ' "$work/console.log" | tr -d '\r' >"$work/figures"
  rc=0
  uroce_vs_rxe_report "$work/figures" || rc=1
  rm -rf "$work"
  return "$rc"
}

# The table of bench vs-rxe from the guest's "vs-rxe: IMPL TEST VALUE [P999]" lines; fails when a pair failed.
uroce_vs_rxe_report() {
  local figures="$1" t impl v failed unit
  head -n 1 "$figures" | sed 's/^vs-rxe: /  /'
  failed=$(grep '^vs-rxe: failed ' "$figures") && printf '%s\n' "$failed" >&2
  # perftest's clock estimate failed: the pair ran again, or (three times) was left out of the medians
  grep -E '^vs-rxe: (retried|unmeasured) ' "$figures" >&2 || true
  printf '  %-31s %11s %18s %11s %18s %9s\n' figure "kernel rxe" "[range]" uroce "[range]" "uroce/rxe"
  for t in write_bw read_bw send_lat write_lat; do
    local -A med=() rng=()
    for impl in rxe uroce; do
      v=$(awk -v i="$impl" -v t="$t" '$2 == i && $3 == t {print $4}' "$figures")
      [ -n "$v" ] || { med[$impl]=0; rng[$impl]="-"; continue; }
      med[$impl]=$(median $v)
      rng[$impl]=$(range $v)
    done
    unit="MB/s, 64 KiB"
    case "$t" in send_lat) unit="us typical, 2 B" ;; write_lat) unit="us typical, 8 B" ;; esac
    awk -v f="ib_$t ($unit)" -v r="${med[rxe]}" -v rr="[${rng[rxe]}]" -v u="${med[uroce]}" -v ur="[${rng[uroce]}]" \
      'BEGIN {printf "  %-31s %11.2f %18s %11.2f %18s %9.2f\n", f, r, rr, u, ur, (r > 0 ? u / r : 0)}'
  done
  # Each p99.9 also as a multiple of the same runs' typical latency; and the floor's: the same number of round trips
  # between two processes through shared memory, each half lasting uroce's typical in fixed work. A device with no
  # variance of its own would show that: the guest's own stalls (timer interrupts, vCPUs taken by the host).
  local typical p999
  for t in send_lat write_lat; do
    for impl in rxe uroce floor; do
      v=$(awk -v i="$impl" -v t="$t" '$2 == i && $3 == t && $5 != "" {print $5}' "$figures")
      [ -n "$v" ] || continue
      typical=$(awk -v i="$impl" -v t="$t" '$2 == i && $3 == t && $5 != "" {print $4}' "$figures")
      typical=$(median $typical)
      p999=$(median $v)
      printf '  ib_%-9s p99.9 %-5s %9.2f us [%s] = %s x typical\n' "$t" "$impl" "$p999" "$(range $v)" \
        "$(awk -v a="$p999" -v b="$typical" 'BEGIN {printf "%.1f", (b > 0 ? a / b : 0)}')"
    done
  done
  [ -z "$failed" ]
}
