# Shell functions shared by the checkout's tools/uroce, the launcher `tools/uroce install` puts in PREFIX/bin/uroce
# (tools/uroce_launcher, which finds this file in PREFIX/share/uroce), and tests/tools_test.sh. Sourced, not run.

# The options of `uroce run`, for the usage texts of both commands.
uroce_run_options_help() {
  cat <<'HELP'
      --addr IP         pin the device's address (default: first free of 127.0.0.1 ... 127.0.255.254)
      --host-device     share the host device of the address (default 127.0.0.1) with every other process that
                        does so in this network namespace, through the host's device service
      --same-host P     on the host device, how packets between its processes travel: shm (shared-memory rings,
                        the default), unix (UNIX sockets), udp (real UDP through the service, for tcpdump)
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
      --trace) RUN_ENV+=("UROCE_TRACE=1"); shift; continue ;;
      --one-packet-per-datagram) RUN_ENV+=("UROCE_ONE_PACKET_PER_DATAGRAM=1"); shift; continue ;;
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
