#!/usr/bin/env bash
# The host device (UROCE_DEVICE=host, `uroce run --host-device`): every process of a network namespace that opens it
# shares one uroce0 on one address through the host's device service (docs/ARCHITECTURE.md, "The host device").
# Unmodified Debian clients through the installed launcher, bytes checked by the clients themselves:
#
#   pairs_share_one_address       4 ibv_rc_pingpong pairs (-c: every received buffer checked) at once on one address:
#                                 8 processes, one GID, 8 different owner bytes in their QPNs; the service leaves when
#                                 the last has gone
#   same_host_paths               an rdma_verify pair (bytes and atomics checked) on each way between two processes of
#                                 the host (--same-host): shm through the shared-memory ring, unix through the UNIX
#                                 connection, udp through real UDP and the service, each shown by the counters (and
#                                 the receiver's ICRC checks: skipped for what a process vouched for, never for UDP)
#   faults_through_the_rings      an rdma_verify pair whose packets cross the rings corrupted, lost, duplicated and
#                                 reordered by the fault injectors: bytes intact, corruption caught by the ICRC
#   direct_access                 RDMA WRITE, READ and SEND between two processes carried out without packets
#                                 (wire/direct_access.h): tests/direct_access_check (bytes, and every refusal as the
#                                 responder's error completion; a stream of large WRITEs shared with the target's
#                                 process, as many halves copied there as the initiator counted), an rdma_verify pair
#                                 of one operation at a time (WRITEs
#                                 and READs direct, atomics as packets between them, every byte checked), and the same
#                                 with --no-direct (none direct)
#   imports_across_processes      ibv_import_device/pd/mr of another process's cmd_fd (SCM_RIGHTS): tests/
#                                 import_share_check (the importer's QP, in the imported PD, receives into, sends
#                                 from, and is written and read through the exporter's region; its keys and handles;
#                                 refusals; after its deregistration, and after a second exporter is killed (-9),
#                                 LOC_PROT_ERR at once), with direct access on and off; on the per-process device ENODEV
#   xrc_between_processes         processes sharing an XRC domain by one file: tests/xrc_share_check (target QPs of
#                                 two processes delivering into each other's SRQs, bytes and completions checked; RNR
#                                 until the other process posts; another domain's SRQ, a WRITE and a SEND longer than
#                                 the receive refused as the SRQ's own target refuses them; `open`: other processes
#                                 open target QPs by number (ibv_open_qp), modify them and get their events through
#                                 their handles, and the QPs live on while one holds them: after
#                                 their creator let go, and after it exited or was killed (a holder runs them on);
#                                 one goes with its last handle), and
#                                 ibv_xsrq_pingpong with three clients, whose server answers each client through
#                                 another client's target QP
#   xrc_open_across_hosts         (root) the same `open` check with the initiator on another host (two network
#                                 namespaces joined by a veth pair)
#   ucx_direct                    UCX's ucx_perftest put and get (rc_verbs) between two processes on one address:
#                                 a framework's WRITEs and READs carried out by direct access
#   two_hosts_eight_processes_each (root: network namespaces) two namespaces joined by a veth pair, 8 processes on
#                                 each one's address (no setting: the default): 4 rdma_verify and 4 ibv_rc_pingpong
#                                 pairs across; what comes from the other host reaches each process on its own socket
#                                 (the kernel steers it)
#   sixty_four_processes          32 ibv_rc_pingpong pairs at once on one address; then, with processes holding the
#                                 device open and idle, the service uses no CPU (at most 2 clock ticks in 3 s)
#   openmpi across two hosts      (root) an Open MPI job of 2 x 4 ranks across the two namespaces, pml ucx and
#                                 pml cm/mtl ofi over verbs;ofi_rxm, no uroce setting: mpi_check's ping-pong,
#                                 allreduce, alltoall
#   the default device            (root) with no setting, the host device on the host's address: a namespace's veth
#                                 address (GID 0; an ibv_rc_pingpong pair shares it), 127.0.0.1 where only lo is, the
#                                 lowest IPv6 address where only those are, the default route's interface's before a
#                                 lower one; with no service binary, the device full (EUSERS), or a service in another
#                                 PID namespace, a device of its own by default, and --host-device fails or joins
#   the GID table                 (root) a host of two addresses: both listed (GID 0 the default route's); an
#                                 ibv_rc_pingpong pair across the veth on the second (its packets on the wire from that
#                                 address, each ICRC checked by scapy), one of the host's own processes across the two
#                                 GIDs (process to process); an address added shows up with IBV_EVENT_GID_CHANGE
#                                 (ibv_asyncwatch), one removed leaves its entry empty
#   fi_pingpong on one address    (root) libfabric's verbs provider (non-loopback interfaces only): msg and rdm pairs
#                                 of two processes sharing one veth address, with no setting
#   pyverbs rdmacm tests          (root) rdma-core's test_rdmacm and test_shared_pd, unmodified: two processes binding
#                                 the device's one address, found through its netdev in sysfs; with no setting (a veth
#                                 address) and on 127.0.0.1
#   service_open_files            a service started by a process with a soft limit of 64 open files still admits
#                                 25 processes holding the device and two pairs (it raises its own limit: each process
#                                 costs it several descriptors)
#   service_killed_is_device_fatal the service killed (-9): ibv_asyncwatch reports IBV_EVENT_DEVICE_FATAL, a running
#                                 ibv_rc_pingpong pair and an ibv_xsrq_pingpong client waiting on receives posted to
#                                 its XRC SRQ fail instead of hanging, and the next open starts a new service
#   no_listener_is_refused        rdma_client and udaddy dialling the device's address where nobody listens: refused
#                                 at once (REJ "invalid service ID", SIDR_REP "unsupported", which the service answers
#                                 as the kernel's CM does), not after the REQ's retries (~25 s)
#   dead_process_is_a_dead_peer   one side of an rdma_verify pair killed (-9): the other fails with RETRY_EXC_ERR
#   dead_process_ends_its_rdma_cm_connections  a killed process's rdma_cm connections end at once, as its kernel's
#                                 REJ or DREQ would end them: rping's server gets REJECTED (or its accept EINVAL) from a
#                                 client killed between its REQ and its RTU (tests/cm_quitter), DISCONNECTED from one
#                                 killed while connected, instead of waiting out the REP's retries or for ever
#   bad_control_messages          garbage on the service's socket gets errors, and the service serves on
#
# Each case takes an address of its own (127.x.y.z at random, or 10.x in its namespaces) and free TCP ports: cases and
# other tests run in parallel without meeting. usage (by Bazel): host_device_test.sh
set -uo pipefail

# shellcheck source=tests/junit.bash
source tests/junit.bash
# shellcheck source=tools/uroce.bash
source tools/uroce.bash

WORK="${TEST_TMPDIR:-$(mktemp -d)}/host_device"
PREFIX="$WORK/prefix"
UROCE="$PREFIX/bin/uroce"
RDMA_VERIFY="$PWD/tests/rdma_verify"
DIRECT_CHECK="$PWD/tests/direct_access_check"
XRC_CHECK="$PWD/tests/xrc_share_check"
IMPORT_CHECK="$PWD/tests/import_share_check"
CM_QUITTER="$PWD/tests/cm_quitter"
TIMEOUT=60

NSEXEC="$WORK/nsexec"

make_prefix() {  # the layout `uroce install` makes, from the runfiles; the MPI program; the rsh agent
  mkdir -p "$PREFIX/bin" "$PREFIX/lib/uroce" "$PREFIX/share/uroce"
  mpicc.openmpi -O2 -o "$WORK/mpi_check_openmpi" tests/frameworks/mpi_check.c
  # Open MPI's rsh agent for hosts that are network namespaces: `nsexec HOST COMMAND` runs COMMAND (one string, for
  # a shell) in namespace HOST under that host name, with mpirun's environment (no UROCE_DEVICE or UROCE_ADDR: each
  # rank's host device takes its own host's address by default).
  cat >"$NSEXEC" <<'AGENT'
#!/bin/sh
host=$1; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"
AGENT
  chmod +x "$NSEXEC"
  cp verbs_api/libibverbs.so.1 verbs_api/librdmacm.so.1 verbs_api/liburoce_preload.so service/uroce-deviced \
    "$PREFIX/lib/uroce/"
  cp tools/uroce.bash "$PREFIX/share/uroce/"
  cp tools/uroce_launcher "$PREFIX/bin/uroce"
}

# The environment of a program run with no setting: the suite's UROCE_DEVICE=process (.bazelrc) removed.
NO_SETTING=(env -u UROCE_DEVICE -u UROCE_ADDR)
random_loopback() { echo "127.$((100 + RANDOM % 100)).$((RANDOM % 250 + 1)).$((RANDOM % 250 + 1))"; }
# service_listed ADDRESS [NAMESPACE]: a service serves ADDRESS (in NAMESPACE, else here).
service_listed() { ${2:+ip netns exec "$2"} grep -q "@uroce/device/v1/$1\$" /proc/net/unix; }
# service_gone_in NAMESPACE ADDRESS: waits (up to 5 s) until no service serves ADDRESS in NAMESPACE (it leaves 0.5 s
# after its last process).
service_gone_in() {
  local tries=0
  while service_listed "$2" "$1" && [ $((tries += 1)) -le 100 ]; do sleep 0.05; done
}
service_pid() { pgrep -f "uroce-deviced --address $1 " | head -n 1; }

# run_pairs LOG_PREFIX ADDRESS N: N ibv_rc_pingpong pairs at once on the host device of ADDRESS; sets PROBLEMS.
run_pairs() {
  local log="$1" addr="$2" n="$3" i port
  local -a servers=() clients=()
  PROBLEMS=""
  for i in $(seq 1 "$n"); do
    port=$(free_tcp_port)
    timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- \
      ibv_rc_pingpong -d uroce0 -g 0 -e -c -s 4096 -n 200 -p "$port" >"$log.server$i" 2>&1 &
    servers+=($!)
    wait_listening "$port" "$!" || PROBLEMS+="server $i did not listen: $(tail -n 5 "$log.server$i")"$'\n'
    timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- \
      ibv_rc_pingpong -d uroce0 -g 0 -e -c -s 4096 -n 200 -p "$port" "$addr" >"$log.client$i" 2>&1 &
    clients+=($!)
  done
  for i in $(seq 1 "$n"); do
    wait "${servers[$((i - 1))]}" || PROBLEMS+="server $i: exit $?: $(tail -n 5 "$log.server$i")"$'\n'
    wait "${clients[$((i - 1))]}" || PROBLEMS+="client $i: exit $?: $(tail -n 5 "$log.client$i")"$'\n'
  done
}

case_pairs_share_one_address() {
  local addr log="$WORK/pairs" problems
  addr=$(random_loopback)
  run_pairs "$log" "$addr" 4
  problems="$PROBLEMS"
  # One GID for all: the address; and 8 different owners (a QPN's top byte) among the 8 processes.
  local gids owners
  gids=$(grep -h "local address" "$log".* | sed 's/.*GID //' | sort -u)
  [ "$gids" = "::ffff:$addr" ] || problems+="GIDs seen: $gids (want ::ffff:$addr only)"$'\n'
  owners=$(grep -h "local address" "$log".* | sed 's/.*QPN 0x\(..\).*/\1/' | sort -u | wc -l)
  [ "$owners" -eq 8 ] || problems+="$owners different owner bytes among 8 processes' QPNs"$'\n'
  # The service leaves when the last process has gone (after its linger of 0.5 s).
  for _ in $(seq 1 60); do service_listed "$addr" || break; sleep 0.1; done
  ! service_listed "$addr" || problems+="the service of $addr is still there 6 s after its last process"$'\n'
  junit_check pairs_share_one_address "$problems"
}

case_same_host_paths() {
  local path addr port log problems="" server rc
  for path in shm unix udp; do
    addr=$(random_loopback)
    port=$(free_tcp_port)
    log="$WORK/path.$path"
    timeout "$TIMEOUT" "$UROCE" run --host-device --same-host "$path" --addr "$addr" --stats -- \
      "$RDMA_VERIFY" --role=server --port="$port" --seed=5 >"$log.server" 2>&1 &
    server=$!
    wait_listening "$port" "$server"
    rc=0
    timeout "$TIMEOUT" "$UROCE" run --host-device --same-host "$path" --addr "$addr" --stats -- \
      "$RDMA_VERIFY" --role=client --port="$port" --host="$addr" --ops=3000 --seed=5 >"$log.client" 2>&1 || rc=$?
    wait "$server" || problems+="$path: server exit status $?: $(tail -n 3 "$log.server")"$'\n'
    [ "$rc" -eq 0 ] || problems+="$path: client exit status $rc: $(tail -n 3 "$log.client")"$'\n'
    # The client's counters: what it handed to the server process directly, and of that through the ring; the
    # server's: the packets whose ICRC it took on the client's word (process to process only: not what crossed UDP).
    local sent ring vouched
    sent=$(awk '/^host_device_peer_sent / {print $2}' "$log.client")
    ring=$(awk '/^host_device_ring_sent / {print $2}' "$log.client")
    vouched=$(awk '/^rx_icrc_vouched / {print $2}' "$log.server")
    case "$path" in
      shm) [ "${ring:-0}" -gt 1000 ] && [ "${vouched:-0}" -gt 1000 ] ||
        problems+="shm: only ${ring:-no} packets through the ring, ${vouched:-no} vouched for"$'\n' ;;
      unix) [ "${sent:-0}" -gt 1000 ] && [ "${ring:-1}" -eq 0 ] && [ "${vouched:-0}" -gt 1000 ] ||
        problems+="unix: $sent packets process to process, $ring through a ring, ${vouched:-no} vouched for"$'\n' ;;
      udp) [ "${sent:-1}" -eq 0 ] && [ "${vouched:-0}" -eq 0 ] &&
        awk '/^udp_datagrams_sent / && $2 > 1000 {ok = 1} END {exit !ok}' "$log.client" ||
        problems+="udp: $sent packets process to process, ${vouched:-no} vouched for, not all by UDP"$'\n' ;;
    esac
  done
  junit_check same_host_paths "$problems"
}

case_faults_through_the_rings() {
  local addr port log="$WORK/faults" problems="" server rc=0
  addr=$(random_loopback)
  port=$(free_tcp_port)
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" --corrupt 0.02 --dup 0.01 --reorder 0.01 --seed 3 \
    --stats -- "$RDMA_VERIFY" --role=server --port="$port" --seed=4 >"$log.server" 2>&1 &
  server=$!
  wait_listening "$port" "$server"
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" --corrupt 0.02 --loss 0.01 --seed 5 --stats -- \
    "$RDMA_VERIFY" --role=client --port="$port" --host="$addr" --ops=3000 --seed=4 >"$log.client" 2>&1 || rc=$?
  wait "$server" || problems+="server exit status $?: $(tail -n 3 "$log.server")"$'\n'
  [ "$rc" -eq 0 ] || problems+="client exit status $rc: $(tail -n 3 "$log.client")"$'\n'
  grep -q "rdma_verify client: OK .* mismatches=0 server_mismatched_bytes=0" "$log.client" ||
    problems+="the client did not verify every byte: $(grep 'rdma_verify client' "$log.client")"$'\n'
  local side
  for side in client server; do
    awk '/^host_device_ring_sent / && $2 > 1000 {r = 1} /^rx_icrc_errors / && $2 > 0 {i = 1} END {exit !(r && i)}' \
      "$log.$side" || problems+="$side: no packets through the ring or no corruption caught by the ICRC"$'\n'
  done
  junit_check faults_through_the_rings "$problems"
}


case_direct_access() {
  local addr port log="$WORK/direct" problems="" server rc direct writes reads
  addr=$(random_loopback)
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" --stats -- "$DIRECT_CHECK" >"$log.check" 2>&1 ||
    problems+="direct_access_check: exit $?: $(grep 'direct_access_check' "$log.check" | grep -v ': ok$')"$'\n'
  awk '/^rc_direct_writes / && $2 > 0 {w = 1} /^rc_direct_reads / && $2 > 0 {r = 1}
       /^rc_direct_sends_received / && $2 > 0 {s = 1} END {exit !(w && r && s)}' "$log.check" ||
    problems+="direct_access_check: no WRITE, READ or SEND was carried out directly"$'\n'
  # write_stream's WRITEs were shared: the initiator counts those whose second half the target copied, the target
  # the halves it copied (both processes print their counters into the one log).
  awk '/^host_device_shared_writes / {w += $2} /^host_device_halves_copied / {h += $2} END {exit !(w > 0 && w == h)}' \
    "$log.check" || problems+="direct_access_check: shared WRITEs $(awk '/^host_device_(shared_writes|halves_copied) / \
      {printf "%s %s ", $1, $2}' "$log.check"): none, or not as many halves copied"$'\n'
  for direct in on off; do
    port=$(free_tcp_port)
    local -a knob=()
    [ "$direct" = on ] || knob=(--no-direct)
    timeout "$TIMEOUT" "$UROCE" run --host-device "${knob[@]}" --addr "$addr" -- \
      "$RDMA_VERIFY" --role=server --port="$port" --seed=6 >"$log.$direct.server" 2>&1 &
    server=$!
    wait_listening "$port" "$server"
    rc=0
    timeout "$TIMEOUT" "$UROCE" run --host-device "${knob[@]}" --addr "$addr" --stats -- \
      "$RDMA_VERIFY" --role=client --port="$port" --host="$addr" --ops=2000 --window=1 --seed=6 \
      >"$log.$direct.client" 2>&1 || rc=$?
    wait "$server" || problems+="$direct: server exit status $?: $(tail -n 3 "$log.$direct.server")"$'\n'
    [ "$rc" -eq 0 ] && grep -q "rdma_verify client: OK .* mismatches=0 server_mismatched_bytes=0" "$log.$direct.client" ||
      problems+="$direct: client exit status $rc: $(grep 'rdma_verify client' "$log.$direct.client")"$'\n'
    writes=$(awk '/^rc_direct_writes / {print $2}' "$log.$direct.client")
    reads=$(awk '/^rc_direct_reads / {print $2}' "$log.$direct.client")
    if [ "$direct" = on ]; then
      [ "${writes:-0}" -gt 200 ] && [ "${reads:-0}" -gt 200 ] ||
        problems+="on: only ${writes:-no} WRITEs and ${reads:-no} READs of 2000 operations direct"$'\n'
    else
      [ "${writes:-1}" -eq 0 ] && [ "${reads:-1}" -eq 0 ] ||
        problems+="--no-direct: ${writes:-?} WRITEs and ${reads:-?} READs direct all the same"$'\n'
    fi
  done
  junit_check direct_access "$problems"
}

# case_ucx_direct: UCX's ucx_perftest put and get (64 KiB, rc_verbs) between two processes sharing one address: a
# framework's RDMA WRITEs and READs (its fences, unsignaled WRs, completions) carried out by direct access.
case_imports_across_processes() {
  local addr log="$WORK/imports" problems="" direct
  addr=$(random_loopback)
  for direct in on off; do
    local -a knob=()
    [ "$direct" = on ] || knob=(--no-direct)
    timeout "$TIMEOUT" "$UROCE" run --host-device "${knob[@]}" --addr "$addr" -- "$IMPORT_CHECK" >"$log.$direct" 2>&1 ||
      problems+="import_share_check ($direct): exit $?: $(grep -v ': ok$' "$log.$direct" | head -n 5)"$'\n'
  done
  # Each process a device of its own: another process's cmd_fd names none of ours.
  timeout "$TIMEOUT" "$UROCE" run -- "$IMPORT_CHECK" refused >"$log.refused" 2>&1 ||
    problems+="import_share_check refused: exit $?: $(grep -v ': ok$' "$log.refused" | head -n 5)"$'\n'
  junit_check imports_across_processes "$problems"
}

case_ucx_direct() {
  local addr log="$WORK/ucx" problems="" test port server rc counter
  addr=$(random_loopback)
  for test in ucp_put_bw ucp_get; do
    port=$(free_tcp_port)
    UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES=uroce0:1 timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- \
      ucx_perftest -p "$port" >"$log.$test.server" 2>&1 &
    server=$!
    wait_listening "$port" "$server"
    rc=0
    UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES=uroce0:1 timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" \
      --stats -- ucx_perftest -p "$port" "$addr" -t "$test" -s 65536 -n 1000 >"$log.$test.client" 2>&1 || rc=$?
    wait "$server" || problems+="$test: server exit status $?: $(tail -n 5 "$log.$test.server")"$'\n'
    [ "$rc" -eq 0 ] && grep -q '^Final:' "$log.$test.client" ||
      problems+="$test: client exit status $rc: $(grep -v '^[a-z_]* [0-9]*$' "$log.$test.client" | tail -n 5)"$'\n'
    counter=rc_direct_writes
    [ "$test" = ucp_put_bw ] || counter=rc_direct_reads
    awk -v c="$counter" '$1 == c && $2 >= 1000 {ok = 1} END {exit !ok}' "$log.$test.client" ||
      problems+="$test: $(grep -h "^$counter " "$log.$test.client") (want one per message at least)"$'\n'
  done
  junit_check "ucx_perftest put and get over direct access" "$problems"
}

case_two_hosts_eight_processes_each() {
  local name=two_hosts_eight_processes_each
  if [ "$(id -u)" -ne 0 ]; then junit_skip "$name" "network namespaces need root"; return; fi
  two_hosts_up "uroce-hd-$$" || { junit_fail "$name" "could not make the namespaces: $TWO_HOSTS_ERROR"; return; }
  local a="$HOST_A" b="$HOST_B" addr_a="$ADDR_A" addr_b="$ADDR_B" problems="" log="$WORK/hosts" i port
  # 8 servers on A's address (4 rdma_verify, 4 ibv_rc_pingpong), 8 clients on B's, each pair across the veth. The
  # namespaces are new: every TCP port is free in them.
  local -a pids=() names=() ports=()
  for i in 1 2 3 4; do
    ip netns exec "$a" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --stats -- \
      "$RDMA_VERIFY" --role=server --port=$((20000 + i)) --seed=$i --qp-timeout=18 >"$log.verify_server$i" 2>&1 &
    pids+=($!); names+=("verify_server$i"); ports+=($((20000 + i)))
    ip netns exec "$a" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- \
      ibv_rc_pingpong -d uroce0 -g 0 -e -c -s 4096 -n 200 -p $((21000 + i)) >"$log.pingpong_server$i" 2>&1 &
    pids+=($!); names+=("pingpong_server$i"); ports+=($((21000 + i)))
  done
  for i in "${!ports[@]}"; do wait_listening_in "$a" "${ports[$i]}" "${pids[$i]}"; done
  for i in 1 2 3 4; do
    ip netns exec "$b" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- \
      "$RDMA_VERIFY" --role=client --port=$((20000 + i)) --host="$addr_a" --ops=1000 --seed=$i --qp-timeout=18 \
      >"$log.verify_client$i" 2>&1 &
    pids+=($!); names+=("verify_client$i")
    ip netns exec "$b" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- \
      ibv_rc_pingpong -d uroce0 -g 0 -e -c -s 4096 -n 200 -p $((21000 + i)) "$addr_a" >"$log.pingpong_client$i" 2>&1 &
    pids+=($!); names+=("pingpong_client$i")
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || problems+="${names[$i]}: exit $?: $(tail -n 5 "$log.${names[$i]}")"$'\n'
  done
  # What came from the other host reached each server on its own socket, steered by the kernel past the service
  # (wire::AttachOwnerSteering): none of them saw fewer than the 1000 operations' requests.
  for i in 1 2 3 4; do
    awk '/^host_device_steered_received / && $2 >= 1000 {ok = 1} END {exit !ok}' "$log.verify_server$i" ||
      problems+="verify_server$i: not steered to its own socket: $(grep -h '^host_device_steered_' "$log.verify_server$i")"$'\n'
  done
  local gids
  gids=$(grep -h "local address" "$log".pingpong_* | sed 's/.*GID //' | sort -u | tr '\n' ' ')
  [ "$gids" = "::ffff:$addr_a ::ffff:$addr_b " ] || problems+="GIDs seen: $gids"$'\n'
  # The port's active MTU follows the interface's, as rxe's does: 1024 on a 1500-byte veth (a 4096-byte packet
  # could not leave it).
  ip netns exec "$a" "${NO_SETTING[@]}" "$UROCE" run -- ibv_devinfo -d uroce0 >"$log.devinfo" 2>&1
  grep -Eq "active_mtu:[[:space:]]+1024 \(3\)" "$log.devinfo" ||
    problems+="active_mtu on a 1500-byte veth: $(grep active_mtu "$log.devinfo")"$'\n'
  two_hosts_down
  junit_check "$name" "$problems"
}

# case_mpi_two_hosts ucx|ofi: an Open MPI job of 2 x 4 ranks across the two hosts, launched by mpirun in one of them
# through an rsh agent that enters the other (NSEXEC); every rank on its host's one shared device, with one setting
# for both hosts (--addr the /24 both are in: each host device takes its host's address there). ucx: pml ucx over
# UCX_TLS=self,rc_verbs,ud_verbs; ofi: pml cm, mtl ofi over verbs;ofi_rxm (connections through rdma_cm, so through
# the service's listen routes).
case_mpi_two_hosts() {
  local kind="$1" name="openmpi 2 x 4 ranks across two hosts ($1)" log="$WORK/mpi.$1" rc=0 problems=""
  if [ "$(id -u)" -ne 0 ]; then junit_skip "$name" "network namespaces need root"; return; fi
  two_hosts_up "uroce-hd-$$" || { junit_fail "$name" "could not make the namespaces: $TWO_HOSTS_ERROR"; return; }
  local -a transport
  if [ "$kind" = ucx ]; then
    transport=(--mca pml ucx -x UCX_TLS=self,rc_verbs,ud_verbs -x UCX_NET_DEVICES=uroce0:1)
  else
    transport=(--mca pml cm --mca mtl ofi -x 'FI_PROVIDER=verbs;ofi_rxm')
  fi
  local net="${ADDR_A%.*}.0/24"
  ip netns exec "$HOST_A" unshare --uts -- bash -c 'hostname "$1"; shift; exec "$@"' _ "$HOST_A" \
    "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --stats -- \
    mpirun.openmpi --allow-run-as-root --oversubscribe --host "$HOST_A:4,$HOST_B:4" -np 8 \
    --mca plm_rsh_agent "$NSEXEC" --mca oob_tcp_if_include "$net" --mca btl '^vader,tcp,openib,uct' \
    "${transport[@]}" "$WORK/mpi_check_openmpi" >"$log" 2>&1 || rc=$?
  two_hosts_down
  [ "$rc" -eq 0 ] || problems+="exit status $rc"$'\n'
  grep -q "^ranks 8 errors 0$" "$log" || problems+="no 'ranks 8 errors 0' line"$'\n'
  # Every rank's device sent packets (a process prints its counters at exit; probes that opened and closed the
  # device print blocks without any).
  local sent
  sent=$(awk '/^tx_packets / && $2 > 0 {n++} END {print n + 0}' "$log")
  [ "$sent" -ge 8 ] || problems+="only $sent devices sent packets, want one per rank (8)"$'\n'
  for addr in "$ADDR_A" "$ADDR_B"; do
    grep -q "counters of uroce0 at $addr (host device transport)" "$log" || problems+="no rank on $addr's host device"$'\n'
  done
  [ -z "$problems" ] || problems+="$(grep -v '^[a-z_]* [0-9]*$' "$log" | tail -n 30)"
  junit_check "$name" "$problems"
}

# case_libfabric_one_address msg|rdm: libfabric's verbs provider, which offers MSG and RDM endpoints only on
# non-loopback interfaces: a fi_pingpong pair of two processes sharing one such address (the veth of a namespace),
# connected through rdma_cm (the service routes the REQ by its listen), data process to process. With no setting
# (no UROCE_DEVICE, no UROCE_ADDR): the host device, on the namespace's one non-loopback address.
case_libfabric_one_address() {
  local ep="$1" name="fi_pingpong -e $1: two processes on one non-loopback address, no setting" log="$WORK/fi.$1"
  local problems=""
  if [ "$(id -u)" -ne 0 ]; then junit_skip "$name" "network namespaces need root"; return; fi
  two_hosts_up "uroce-hd-$$" || { junit_fail "$name" "could not make the namespaces: $TWO_HOSTS_ERROR"; return; }
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- \
    fi_pingpong -p verbs -e "$ep" -B 9228 -I 100 >"$log.server" 2>&1 &
  local server=$! rc=0
  wait_listening_in "$HOST_A" 9228 "$server"
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --stats -- \
    fi_pingpong -p verbs -e "$ep" -P 9228 -I 100 "$ADDR_A" >"$log.client" 2>&1 || rc=$?
  wait "$server" || problems+="server exit status $?: $(tail -n 5 "$log.server")"$'\n'
  two_hosts_down
  [ "$rc" -eq 0 ] || problems+="client exit status $rc: $(grep -v '^[a-z_]* [0-9]*$' "$log.client" | tail -n 5)"$'\n'
  # Its last line is the largest size: bytes, iterations, "=100" (all checked and completed).
  grep -v '^[a-z_]* [0-9]*$' "$log.client" | tail -n 1 | grep -q '=100' ||
    problems+="the client did not complete its 100 iterations"$'\n'
  awk '/^cm_mads_received / && $2 > 0 {c = 1} /^host_device_ring_sent / && $2 > 0 {p = 1} END {exit !(c && p)}' \
    "$log.client" || problems+="no CM MADs received or no packets handed process to process"$'\n'
  junit_check "$name" "$problems"
}

# case_pyverbs_rdmacm: rdma-core's own rdmacm and shared-PD tests (python3-pyverbs), unmodified, in a namespace: the
# rdmacm tests take the device's IP address from the first address of its netdev (/sys/class/infiniband/uroce0/
# device/net/, which the host device lists), fork two processes that both bind it, and connect them (RC, UD,
# multicast joins and leaves, reads, writes, rejects); the shared-PD test imports a PD and MR (ibv_import_*). Once
# with no setting (the host device on the namespace's veth address), once on 127.0.0.1 (the namespace's own lo).
# pyverbs counts a player that died of a signal as a pass, so a fault handler makes such a death print "Fatal Python
# error", which fails the case.
case_pyverbs_rdmacm() {
  local name="pyverbs rdmacm and shared-PD tests: two processes on one address, with no setting and on 127.0.0.1"
  local tests="$WORK/pyverbs/tests" problems="" where
  if [ "$(id -u)" -ne 0 ]; then junit_skip "$name" "network namespaces need root"; return; fi
  if [ ! -d /usr/share/doc/rdma-core/tests ]; then junit_fail "$name" "python3-pyverbs is not installed"; return; fi
  mkdir -p "$WORK/pyverbs"
  cp -r /usr/share/doc/rdma-core/tests "$tests" && gunzip -f "$tests"/*.gz
  two_hosts_up "uroce-hd-$$" || { junit_fail "$name" "could not make the namespaces: $TWO_HOSTS_ERROR"; return; }
  for where in "no setting" 127.0.0.1; do
    local log="$WORK/pyverbs/rdmacm.${where// /_}" rc=0
    local -a how=("${NO_SETTING[@]}" "$UROCE" run --)
    [ "$where" = "no setting" ] || how=("$UROCE" run --host-device --addr "$where" --)
    (cd "$WORK/pyverbs" && ip netns exec "$HOST_A" env PYTHONFAULTHANDLER=1 timeout "$TIMEOUT" \
      "${how[@]}" /usr/bin/python3 tests/run_tests.py --dev uroce0 --gid 0 -v test_rdmacm test_shared_pd) \
      >"$log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || problems+="on $where: exit status $rc: $(tail -n 5 "$log")"$'\n'
    grep -q '^Ran 11 tests' "$log" ||
      problems+="on $where: not the 10 cases of test_rdmacm and 1 of test_shared_pd: $(tail -n 3 "$log")"$'\n'
    ! grep -q 'skipped' "$log" || problems+="on $where: skipped: $(grep -m 1 skipped "$log")"$'\n'
    ! grep -q 'Fatal Python error' "$log" || problems+="on $where: a player died: $(grep -m 3 -A 3 Fatal "$log")"$'\n'
  done
  two_hosts_down
  junit_check "$name" "$problems"
}

# case_the_default_device: with no setting (no UROCE_DEVICE, no UROCE_ADDR) a process gets the host device on the
# host's address: in a namespace whose only other interface is a veth, its address is GID 0, and an ibv_rc_pingpong
# pair shares the one device (two owner numbers, one address); in a namespace with lo alone, 127.0.0.1; with IPv6
# addresses only, the lowest of them; with a default route, its interface's, not a lower one. With no service binary
# to start, or the device full, the default falls back to a device of its own and --host-device fails. A service
# started in another PID namespace (as another Bazel test's sandbox would) is not joined by default, since it ends
# with that namespace: the process says so and takes a device of its own on a loopback address; --host-device
# (UROCE_DEVICE=host) joins it all the same.
case_the_default_device() {
  local name="the default device: the host device on the host's address" log="$WORK/default" problems="" port
  if [ "$(id -u)" -ne 0 ]; then junit_skip "$name" "network namespaces need root"; return; fi
  two_hosts_up "uroce-hd-$$" || { junit_fail "$name" "could not make the namespaces: $TWO_HOSTS_ERROR"; return; }
  local bare="uroce-hd-$$-lo"
  ip netns add "$bare" && ip -n "$bare" link set lo up || problems+="could not make a namespace with lo alone"$'\n'
    ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- ibv_devinfo -v >"$log.devinfo" 2>&1
  grep -q "GID\[  0\]:.*::ffff:$ADDR_A, RoCE v2" "$log.devinfo" ||
    problems+="GID 0 is not the veth's $ADDR_A: $(grep -m 2 'GID\|uroce:' "$log.devinfo")"$'\n'
  ip netns exec "$bare" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- ibv_devinfo -v >"$log.bare" 2>&1
  grep -q 'GID\[  0\]:.*::ffff:127.0.0.1, RoCE v2' "$log.bare" ||
    problems+="with lo alone, GID 0 is not 127.0.0.1: $(grep -m 2 'GID\|uroce:' "$log.bare")"$'\n'
  # With no IPv4 address but loopback's, the lowest IPv6 one (a veth pair inside the namespace: up, ULA, no DAD).
  ip -n "$bare" link add v6a type veth peer name v6b && ip -n "$bare" link set v6a up &&
    ip -n "$bare" link set v6b up &&
    ip -n "$bare" addr add fd00:7e::9/64 dev v6a nodad && ip -n "$bare" addr add fd00:7e::5/64 dev v6b nodad ||
    problems+="could not give the namespace IPv6 addresses"$'\n'
  ip netns exec "$bare" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- ibv_devinfo -v >"$log.v6" 2>&1
  grep -q 'GID\[  0\]:.*fd00:7e::5, RoCE v2' "$log.v6" ||
    problems+="with IPv6 addresses only, GID 0 is not the lowest: $(grep -m 2 'GID\|uroce:' "$log.v6")"$'\n'
  # With a default route, its interface's address, though another interface's is lower.
  ip -n "$bare" link add v4a type veth peer name v4b && ip -n "$bare" link set v4a up &&
    ip -n "$bare" link set v4b up &&
    ip -n "$bare" addr add 10.200.0.9/24 dev v4a && ip -n "$bare" addr add 10.100.0.9/24 dev v4b &&
    ip -n "$bare" route add default via 10.200.0.1 dev v4a onlink ||
    problems+="could not give the namespace a route"$'\n'
  ip netns exec "$bare" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- ibv_devinfo -v >"$log.route" 2>&1
  grep -q 'GID\[  0\]:.*::ffff:10.200.0.9, RoCE v2' "$log.route" ||
    problems+="GID 0 is not the default route's interface's: $(grep -m 2 'GID\|uroce:' "$log.route")"$'\n'
  ip netns del "$bare" 2>/dev/null
  port=$(free_tcp_port)
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --stats -- \
    ibv_rc_pingpong -d uroce0 -g 0 -c -s 4096 -n 200 -p "$port" >"$log.server" 2>&1 &
  local server=$! rc=0
  wait_listening_in "$HOST_A" "$port" "$server"
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --stats -- \
    ibv_rc_pingpong -d uroce0 -g 0 -c -s 4096 -n 200 -p "$port" 127.0.0.1 >"$log.client" 2>&1 || rc=$?
  wait "$server" || problems+="pingpong server: exit $?: $(grep -v '^[a-z_]* [0-9]*$' "$log.server" | tail -n 3)"$'\n'
  [ "$rc" -eq 0 ] || problems+="pingpong client: exit $rc: $(grep -v '^[a-z_]* [0-9]*$' "$log.client" | tail -n 3)"$'\n'
  local owners
  owners=$(cat "$log.server" "$log.client" | awk '/^host_device_owner / {print $2}' | sort -u | wc -l)
  [ "$(grep -c "counters of uroce0 at $ADDR_A (host device transport)" "$log.server" "$log.client" |
    awk -F: '{n += $2} END {print n}')" -eq 2 ] && [ "$owners" -eq 2 ] ||
    problems+="the pair did not share the host device of $ADDR_A under two owner numbers"$'\n'
  # No service to start (once the pair's has left): by default a device of its own (said), with --host-device none.
  service_gone_in "$HOST_A" "$ADDR_A"
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" UROCE_DEVICE_SERVICE="$WORK/no-such-service" timeout "$TIMEOUT" \
    "$UROCE" run -- ibv_devinfo -v >"$log.unstartable" 2>&1
  grep -q 'cannot start' "$log.unstartable" && grep -q 'a device of its own instead' "$log.unstartable" &&
    grep -q 'GID\[  0\]:.*::ffff:127\.' "$log.unstartable" ||
    problems+="with no service to start, no device of its own: $(grep -m 3 'GID\|uroce:' "$log.unstartable")"$'\n'
  local insisted=0
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" UROCE_DEVICE_SERVICE="$WORK/no-such-service" timeout "$TIMEOUT" \
    "$UROCE" run --host-device -- ibv_devinfo -v >"$log.unstartable_insisting" 2>&1 || insisted=$?
  [ "$insisted" -ne 0 ] && ! grep -q 'GID\[' "$log.unstartable_insisting" ||
    problems+="--host-device with no service to start opened a device: $(tail -n 3 "$log.unstartable_insisting")"$'\n'
  # A full device (a service started with room for one process, UROCE_SERVICE_MAX_PROCESSES=1, and one holding it):
  # by default the next process is refused (EUSERS) and takes a device of its own; --host-device opens none.
  port=$(free_tcp_port)
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" UROCE_SERVICE_MAX_PROCESSES=1 timeout "$TIMEOUT" "$UROCE" run -- \
    ibv_rc_pingpong -d uroce0 -g 0 -p "$port" >"$log.full_holder" 2>&1 &
  local full_holder=$!
  wait_listening_in "$HOST_A" "$port" "$full_holder"
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- ibv_devinfo -v >"$log.full" 2>&1
  grep -q 'Too many users' "$log.full" && grep -q 'a device of its own instead' "$log.full" &&
    grep -q 'GID\[  0\]:.*::ffff:127\.' "$log.full" ||
    problems+="beside a full device, no device of its own: $(grep -m 3 'GID\|uroce:' "$log.full")"$'\n'
  insisted=0
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --host-device -- ibv_devinfo -v \
    >"$log.full_insisting" 2>&1 || insisted=$?
  [ "$insisted" -ne 0 ] && ! grep -q 'GID\[' "$log.full_insisting" ||
    problems+="--host-device beside a full device opened one: $(tail -n 3 "$log.full_insisting")"$'\n'
  kill "$full_holder" 2>/dev/null
  wait "$full_holder" 2>/dev/null
  service_gone_in "$HOST_A" "$ADDR_A"
  # A holder of the device in a PID namespace of its own starts the service there.
  port=$(free_tcp_port)
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" unshare --pid --fork --kill-child --mount-proc \
    timeout "$TIMEOUT" "$UROCE" run -- \
    ibv_rc_pingpong -d uroce0 -g 0 -p "$port" >"$log.sandboxed" 2>&1 &
  local holder=$!
  wait_listening_in "$HOST_A" "$port" "$holder"
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- ibv_devinfo -v >"$log.outside" 2>&1
  grep -q 'served from another PID namespace' "$log.outside" && grep -q 'GID\[  0\]:.*::ffff:127\.' "$log.outside" ||
    problems+="beside a service in another PID namespace, no device of its own: $(grep -m 3 'GID\|uroce:' \
      "$log.outside")"$'\n'
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --host-device -- ibv_devinfo -v \
    >"$log.insisting" 2>&1
  grep -q "GID\[  0\]:.*::ffff:$ADDR_A, RoCE v2" "$log.insisting" ||
    problems+="--host-device did not join the service: $(grep -m 3 'GID\|uroce:' "$log.insisting")"$'\n'
  kill -KILL "$holder" 2>/dev/null  # unshare --fork ignores SIGTERM; --kill-child ends the namespace with it
  wait "$holder" 2>/dev/null
  two_hosts_down
  junit_check "$name" "$problems"
}

# two_hosts_second_address NAME: two_hosts_up NAME, and on HOST_A's veth a second address, SECOND, in a /24 of its own
# (outside two_hosts_up's 10.20-219.x), which HOST_B reaches over the veth and HOST_A's default route goes towards.
# Fails, with TWO_HOSTS_ERROR saying why, when it cannot.
two_hosts_second_address() {
  two_hosts_up "$1" || return 1
  SECOND="10.$((RANDOM % 20 + 230)).$((RANDOM % 250)).1"
  TWO_HOSTS_ERROR=$({ ip -n "$HOST_A" addr add "$SECOND/24" dev "$VETH_A" &&
    ip -n "$HOST_A" route add default via "$ADDR_B" &&
    ip -n "$HOST_B" route add "${SECOND%.*}.0/24" dev "$VETH_B"; } 2>&1) ||
    { two_hosts_down; return 1; }
}

# A host of two addresses (the veth's, with the default route, and a second one on it): the device lists both, the
# veth's at GID 0; a pair across the veth whose server sends from the second address (its GID index), every packet
# on the wire from that address with an ICRC scapy finds right; a pair of the host's own processes on the two GIDs
# (process to process); an address added shows in the table and ibv_asyncwatch reports IBV_EVENT_GID_CHANGE; one
# removed leaves its entry empty, and a process that opens the device after that finds the added address at the index
# the running ones have (the service keeps the host's table); an address whose UDP 4791 another program holds stays
# out.
case_gid_table_follows_the_host() {
  local name="the GID table lists the host's addresses" log="$WORK/gids" problems="" port second added held index rc
  if [ "$(id -u)" -ne 0 ]; then junit_skip "$name" "network namespaces need root"; return; fi
  two_hosts_second_address "uroce-hd-$$" || { junit_fail "$name" "could not make the hosts: $TWO_HOSTS_ERROR"; return; }
  second="$SECOND"
  added="10.$((RANDOM % 20 + 230)).$((RANDOM % 250)).9"
  held="${added%.*}.10"
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- ibv_devinfo -v >"$log.devinfo" 2>&1
  index=$(sed -n "s/.*GID\[ *\([0-9]*\)\]:.*::ffff:$second, RoCE v2.*/\1/p" "$log.devinfo")
  grep -q "GID\[  0\]:.*::ffff:$ADDR_A, RoCE v2" "$log.devinfo" && [ -n "$index" ] && [ "$index" != 0 ] ||
    problems+="the table is not GID 0 $ADDR_A and another $second: $(grep 'GID\|uroce:' "$log.devinfo")"$'\n'
  index=${index:-1}
  # Across the veth: the server answers from the second address; B's end of the veth sees every packet from there.
  ip netns exec "$HOST_B" tcpdump -i "$VETH_B" --immediate-mode -U -w "$log.pcap" \
    "udp port 4791 and src host $second" 2>"$log.tcpdump" &
  local dump=$!
  for _ in $(seq 1 100); do grep -q "listening on" "$log.tcpdump" && break; sleep 0.05; done
  port=$(free_tcp_port)
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --one-packet-per-datagram -- \
    ibv_rc_pingpong -d uroce0 -g "$index" -c -s 4096 -n 100 -p "$port" >"$log.server" 2>&1 &
  local server=$!
  wait_listening_in "$HOST_A" "$port" "$server"
  rc=0
  ip netns exec "$HOST_B" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- \
    ibv_rc_pingpong -d uroce0 -g 0 -c -s 4096 -n 100 -p "$port" "$ADDR_A" >"$log.client" 2>&1 || rc=$?
  wait "$server" || problems+="pingpong server on GID $index: exit $?: $(tail -n 3 "$log.server")"$'\n'
  [ "$rc" -eq 0 ] || problems+="pingpong client: exit $rc: $(tail -n 3 "$log.client")"$'\n'
  grep -q "local address:.*GID ::ffff:$second\$" "$log.server" && grep -q "remote address:.*GID ::ffff:$second\$" \
    "$log.client" || problems+="the pair did not use $second: $(grep -h address "$log.server" "$log.client")"$'\n'
  sleep 0.2
  kill -INT "$dump" 2>/dev/null
  wait "$dump" 2>/dev/null
  local scapy
  scapy=$(/usr/bin/python3 tests/scapy_icrc_check.py "$log.pcap" 2>&1) ||
    problems+="packets from $second on the wire: $scapy"$'\n'
  [[ "$scapy" =~ ^packets\ ([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 200 ] ||
    problems+="only '$scapy' from $second on the wire: 100 round trips of 4 packets and their ACKs expected"$'\n'
  # On the host: a pair of its own processes, one on each GID, process to process (the rings, or direct access).
  port=$(free_tcp_port)
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- \
    ibv_rc_pingpong -d uroce0 -g "$index" -c -s 4096 -n 100 -p "$port" >"$log.local_server" 2>&1 &
  server=$!
  wait_listening_in "$HOST_A" "$port" "$server"
  rc=0
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --stats -- \
    ibv_rc_pingpong -d uroce0 -g 0 -c -s 4096 -n 100 -p "$port" 127.0.0.1 >"$log.local_client" 2>&1 || rc=$?
  wait "$server" || problems+="same-host server on GID $index: exit $?: $(tail -n 3 "$log.local_server")"$'\n'
  [ "$rc" -eq 0 ] || problems+="same-host client: exit $rc: $(grep -v '^[a-z_]* [0-9]*$' "$log.local_client" |
    tail -n 3)"$'\n'
  awk '/^(host_device_ring_sent|host_device_direct_bytes) / {n += $2} END {exit !(n > 0)}' "$log.local_client" ||
    problems+="the same-host pair did not go process to process: $(grep '^host_device_' "$log.local_client")"$'\n'
  # An address added: the table lists it (a device opened before hears IBV_EVENT_GID_CHANGE); one removed: gone. The
  # watcher keeps the service (and its table) through the rest.
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- ibv_asyncwatch -d uroce0 \
    >"$log.async" 2>&1 &
  local watch=$!
  for _ in $(seq 1 100); do grep -q "async event FD" "$log.async" && break; sleep 0.05; done
  ip -n "$HOST_A" addr add "$added/24" dev "$VETH_A" || problems+="could not add $added"$'\n'
  for _ in $(seq 1 100); do grep -q "GID_CHANGE" "$log.async" && break; sleep 0.05; done
  grep -q "IBV_EVENT_GID_CHANGE" "$log.async" || problems+="no GID change event: $(cat "$log.async")"$'\n'
  # UDP 4791 of a third address held by another program (as kernel rxe holds it) before the address comes.
  ip netns exec "$HOST_A" /usr/bin/python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 15, 1)  # IP_FREEBIND: the address is not there yet
s.bind((sys.argv[1], 4791))
print("held", flush=True)
time.sleep(120)' "$held" >"$log.holder" 2>&1 &
  local holder=$!
  for _ in $(seq 1 100); do grep -q "held" "$log.holder" && break; sleep 0.05; done
  ip -n "$HOST_A" addr add "$held/24" dev "$VETH_A" || problems+="could not add $held"$'\n'
  ip -n "$HOST_A" addr del "$second/24" dev "$VETH_A" || problems+="could not remove $second"$'\n'
  local added_index=""
  for _ in $(seq 1 100); do  # until the service has seen both changes
    ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run -- ibv_devinfo -v >"$log.changed" 2>&1
    ! grep -q "::ffff:$second," "$log.changed" && break
    sleep 0.05
  done
  added_index=$(sed -n "s/.*GID\[ *\([0-9]*\)\]:.*::ffff:$added, RoCE v2.*/\1/p" "$log.changed")
  # The running processes have it at the first empty entry then, the one after the second address's.
  [ "$added_index" = $((index + 1)) ] && ! grep -q "::ffff:$second," "$log.changed" ||
    problems+="after the changes, $added at GID ${added_index:-none} (want $((index + 1))): $(grep 'GID\|uroce:' \
      "$log.changed" | tr '\n' ' ')"$'\n'
  ! grep -q "::ffff:$held," "$log.changed" ||
    problems+="$held, whose UDP 4791 another program holds, is listed: $(grep GID "$log.changed" | tr '\n' ' ')"$'\n'
  kill "$watch" "$holder" 2>/dev/null
  wait "$watch" "$holder" 2>/dev/null
  two_hosts_down
  junit_check "$name" "$problems"
}

# rdma_cm on every GID of the host device (a host of two addresses, as above): an id bound to the second address
# has the device and its GID; a pair across the veth dialled at the second address, and one whose client names no
# source but whose route to the peer leaves from the second address, each with every packet of the host's on the
# wire from that address (the CM's MADs too) and none from GID 0's; a pair of the host's own processes at the second
# address, and the server of a client killed there hearing DISCONNECTED; an address the host lacks: EADDRNOTAVAIL.
case_rdma_cm_on_every_gid() {
  local name="rdma_cm on every GID of the host" log="$WORK/cm_gids" problems="" port second rc server client dump
  if [ "$(id -u)" -ne 0 ]; then junit_skip "$name" "network namespaces need root"; return; fi
  two_hosts_second_address "uroce-cg-$$" || { junit_fail "$name" "could not make the hosts: $TWO_HOSTS_ERROR"; return; }
  second="$SECOND"
  local -a in_a=(ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --)
  # shellcheck disable=SC2034  # cm_pair uses it by name
  local -a in_b=(ip netns exec "$HOST_B" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --)
  # cm_pair WHAT SERVER_SIDE SERVER_ADDRESS CLIENT_SIDE [CLIENT_ARGS...]: rping -V (the client checks the bytes it
  # reads back) for 20 rounds; B's end of the veth captured meanwhile into $log.WHAT.pcap.
  cm_pair() {
    local what="$1" server_side="$2" at="$3" client_side="$4"
    shift 4
    local -n srv="$server_side" cli="$client_side"
    # --immediate-mode: each packet as it comes (else the last block of the ring may still be unread at the end).
    ip netns exec "$HOST_B" tcpdump -i "$VETH_B" --immediate-mode -U -w "$log.$what.pcap" udp port 4791 \
      2>"$log.$what.tcpdump" &
    dump=$!
    for _ in $(seq 1 100); do grep -q "listening on" "$log.$what.tcpdump" && break; sleep 0.05; done
    port=$(free_tcp_port)
    "${srv[@]}" rping -s -a "$at" -p "$port" -C 20 -v >"$log.$what.server" 2>&1 &
    server=$!
    wait_listening_in "$([ "$server_side" = in_a ] && echo "$HOST_A" || echo "$HOST_B")" "$port" "$server"
    rc=0
    "${cli[@]}" rping -c -a "$at" -p "$port" -C 20 -V -v "$@" >"$log.$what.client" 2>&1 || rc=$?
    wait "$server" || problems+="$what: rping server: exit $?: $(tail -n 3 "$log.$what.server")"$'\n'
    [ "$rc" -eq 0 ] && [ "$(grep -c 'ping data' "$log.$what.client")" -eq 20 ] ||
      problems+="$what: rping client: exit $rc: $(tail -n 3 "$log.$what.client")"$'\n'
    sleep 0.2
    kill -INT "$dump" 2>/dev/null
    wait "$dump" 2>/dev/null
  }
  # on_wire WHAT FILTER: the packets of $log.WHAT.pcap that FILTER takes.
  on_wire() { tcpdump -n -r "$log.$1.pcap" "$2" 2>/dev/null | wc -l; }
  # Dialled at the second address from the other host.
  cm_pair across in_a "$second" in_b
  [ "$(on_wire across "src host $second")" -ge 40 ] && [ "$(on_wire across "dst host $second")" -ge 40 ] &&
    [ "$(on_wire across "host $ADDR_A")" -eq 0 ] ||
    problems+="dialled at $second: $(on_wire across "src host $second") packets from it, $(on_wire across \
      "dst host $second") to it, $(on_wire across "host $ADDR_A") from or to GID 0's $ADDR_A"$'\n'
  # A client naming no source whose route to the peer leaves from the second address.
  ip -n "$HOST_A" route add "$ADDR_B/32" dev "$VETH_A" src "$second" || problems+="could not route by $second"$'\n'
  cm_pair routed in_b "$ADDR_B" in_a
  [ "$(on_wire routed "src host $second")" -ge 40 ] && [ "$(on_wire routed "host $ADDR_A")" -eq 0 ] ||
    problems+="routed from $second: $(on_wire routed "src host $second") packets from it, $(on_wire routed \
      "host $ADDR_A") from or to $ADDR_A"$'\n'
  ip -n "$HOST_A" route del "$ADDR_B/32" dev "$VETH_A"
  # Two processes of the host at the second address; then a client killed there ends its server's connection.
  cm_pair local in_a "$second" in_a
  [ "$(on_wire local "udp")" -eq 0 ] || problems+="the host's own pair sent $(on_wire local udp) packets out"$'\n'
  port=$(free_tcp_port)
  "${in_a[@]}" rping -s -a "$second" -p "$port" -C 100000000 -v -d >"$log.kill.server" 2>&1 &
  server=$!
  wait_listening_in "$HOST_A" "$port" "$server"
  "${in_a[@]}" rping -c -a "$second" -p "$port" -C 100000000 >"$log.kill.client" 2>&1 &
  client=$!
  for _ in $(seq 1 100); do grep -q "ping data" "$log.kill.server" && break; sleep 0.05; done
  pkill -9 -f "rping -c -a $second -p $port " || problems+="no rping client to kill"$'\n'
  local start=$SECONDS
  wait "$server"
  wait "$client" 2>/dev/null
  grep -q "RDMA_CM_EVENT_DISCONNECTED" "$log.kill.server" ||
    problems+="the killed client's server: $(grep -v "ping data" "$log.kill.server" | tail -n 3 | tr '\n' ' ')"$'\n'
  [ $((SECONDS - start)) -le 5 ] || problems+="the killed client's server took $((SECONDS - start)) s to end"$'\n'
  # An address the host does not have.
  "${in_a[@]}" rping -s -a "10.$((RANDOM % 20 + 230)).$((RANDOM % 250)).77" -p "$(free_tcp_port)" >"$log.absent" 2>&1
  grep -q "rdma_bind_addr: Cannot assign requested address" "$log.absent" ||
    problems+="binding an address the host lacks: $(tr '\n' ' ' <"$log.absent")"$'\n'
  two_hosts_down
  junit_check "$name" "$problems"
}

# IPv6 GIDs beside an IPv4 GID 0 (two namespaces, each with an IPv6 address on its veth besides its IPv4 one): each
# lists its IPv6 address as a GID after GID 0; an ibv_rc_pingpong pair across the veth on those GIDs, every RoCE packet
# on the wire IPv6 between the two addresses and none IPv4; rping over IPv6 (rdma_cm bound to the IPv6 address, the
# client checking the bytes); and a pair of one host's processes on its IPv6 GID, process to process.
case_ipv6_gids_beside_ipv4() {
  local name="IPv6 GIDs beside an IPv4 GID 0" log="$WORK/v6gids" problems="" port rc server v6a v6b index_a index_b dump
  if [ "$(id -u)" -ne 0 ]; then junit_skip "$name" "network namespaces need root"; return; fi
  two_hosts_up "uroce-v6-$$" || { junit_fail "$name" "could not make the namespaces: $TWO_HOSTS_ERROR"; return; }
  local net="fd00:$((RANDOM % 9000 + 1000))"
  v6a="$net::1" v6b="$net::2"
  ip -n "$HOST_A" addr add "$v6a/64" dev "$VETH_A" nodad && ip -n "$HOST_B" addr add "$v6b/64" dev "$VETH_B" nodad ||
    problems+="could not add the IPv6 addresses"$'\n'
  local -a in_a=(ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --)
  local -a in_b=(ip netns exec "$HOST_B" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --)
  "${in_a[@]}" ibv_devinfo -v >"$log.devinfo_a" 2>&1
  "${in_b[@]}" ibv_devinfo -v >"$log.devinfo_b" 2>&1
  index_a=$(sed -n "s/.*GID\[ *\([0-9]*\)\]:[[:space:]]*$v6a, RoCE v2.*/\1/p" "$log.devinfo_a")
  index_b=$(sed -n "s/.*GID\[ *\([0-9]*\)\]:[[:space:]]*$v6b, RoCE v2.*/\1/p" "$log.devinfo_b")
  grep -q "GID\[  0\]:.*::ffff:$ADDR_A, RoCE v2" "$log.devinfo_a" && [ -n "$index_a" ] && [ "$index_a" != 0 ] &&
    [ -n "$index_b" ] || problems+="the tables: $(grep -h GID "$log.devinfo_a" "$log.devinfo_b" | tr '\n' ' ')"$'\n'
  ip netns exec "$HOST_B" tcpdump -i "$VETH_B" --immediate-mode -U -w "$log.pcap" udp port 4791 2>"$log.tcpdump" &
  dump=$!
  for _ in $(seq 1 100); do grep -q "listening on" "$log.tcpdump" && break; sleep 0.05; done
  port=$(free_tcp_port)
  # One RoCE packet a datagram, so that the capture counts packets.
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --one-packet-per-datagram -- \
    ibv_rc_pingpong -d uroce0 -g "${index_a:-1}" -c -s 4096 -n 100 -p "$port" >"$log.server" 2>&1 &
  server=$!
  wait_listening_in "$HOST_A" "$port" "$server"
  rc=0
  ip netns exec "$HOST_B" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --one-packet-per-datagram -- \
    ibv_rc_pingpong -d uroce0 -g "${index_b:-1}" -c -s 4096 -n 100 -p "$port" "$ADDR_A" >"$log.client" 2>&1 || rc=$?
  wait "$server" || problems+="pingpong server: exit $?: $(tail -n 3 "$log.server")"$'\n'
  [ "$rc" -eq 0 ] || problems+="pingpong client: exit $rc: $(tail -n 3 "$log.client")"$'\n'
  sleep 0.2
  kill -INT "$dump" 2>/dev/null
  wait "$dump" 2>/dev/null
  local from to v4
  from=$(tcpdump -n -r "$log.pcap" "ip6 and src host $v6a and dst host $v6b" 2>/dev/null | wc -l)
  to=$(tcpdump -n -r "$log.pcap" "ip6 and src host $v6b and dst host $v6a" 2>/dev/null | wc -l)
  v4=$(tcpdump -n -r "$log.pcap" "ip" 2>/dev/null | wc -l)
  # 100 round trips of 4 packets (a 1024-byte path MTU) and their ACKs.
  [ "$from" -ge 200 ] && [ "$to" -ge 200 ] && [ "$v4" -eq 0 ] ||
    problems+="on the wire: $from packets $v6a -> $v6b, $to back, $v4 over IPv4"$'\n'
  # rdma_cm over IPv6.
  port=$(free_tcp_port)
  "${in_a[@]}" rping -s -a "$v6a" -p "$port" -C 20 -v >"$log.rping_server" 2>&1 &
  server=$!
  wait_listening_in "$HOST_A" "$port" "$server"
  rc=0
  "${in_b[@]}" rping -c -a "$v6a" -p "$port" -C 20 -V -v >"$log.rping_client" 2>&1 || rc=$?
  wait "$server" || problems+="rping server: exit $?: $(tail -n 3 "$log.rping_server")"$'\n'
  [ "$rc" -eq 0 ] && [ "$(grep -c 'ping data' "$log.rping_client")" -eq 20 ] ||
    problems+="rping over IPv6: exit $rc: $(tail -n 3 "$log.rping_client")"$'\n'
  # Two processes of A on its IPv6 GID: process to process.
  port=$(free_tcp_port)
  "${in_a[@]}" ibv_rc_pingpong -d uroce0 -g "${index_a:-1}" -c -s 4096 -n 100 -p "$port" >"$log.local_server" 2>&1 &
  server=$!
  wait_listening_in "$HOST_A" "$port" "$server"
  rc=0
  ip netns exec "$HOST_A" "${NO_SETTING[@]}" timeout "$TIMEOUT" "$UROCE" run --stats -- \
    ibv_rc_pingpong -d uroce0 -g "${index_a:-1}" -c -s 4096 -n 100 -p "$port" 127.0.0.1 >"$log.local_client" 2>&1 ||
    rc=$?
  wait "$server" || problems+="same-host server: exit $?: $(tail -n 3 "$log.local_server")"$'\n'
  [ "$rc" -eq 0 ] || problems+="same-host client: exit $rc: $(grep -v '^[a-z_]* [0-9]*$' "$log.local_client" |
    tail -n 3)"$'\n'
  awk '/^(host_device_ring_sent|host_device_direct_bytes) / {n += $2} END {exit !(n > 0)}' "$log.local_client" ||
    problems+="the same-host pair did not go process to process: $(grep '^host_device_' "$log.local_client")"$'\n'
  two_hosts_down
  junit_check "$name" "$problems"
}

case_sixty_four_processes() {
  local addr log="$WORK/64" problems
  addr=$(random_loopback)
  run_pairs "$log" "$addr" 32
  problems="$PROBLEMS"
  local owners
  owners=$(grep -h "local address" "$log".* | sed 's/.*QPN 0x\(..\).*/\1/' | sort -u | wc -l)
  [ "$owners" -eq 64 ] || problems+="$owners different owner bytes among 64 processes' QPNs"$'\n'
  # Idle: processes hold the device open (ibv_asyncwatch blocks for events), nothing moves.
  local -a holders=()
  for _ in $(seq 1 8); do
    "$UROCE" run --host-device --addr "$addr" -- ibv_asyncwatch -d uroce0 >/dev/null 2>&1 &
    holders+=($!)
  done
  local pid="" before after
  for _ in $(seq 1 100); do pid=$(service_pid "$addr"); [ -n "$pid" ] && break; sleep 0.05; done
  sleep 1
  if [ -z "$pid" ]; then
    problems+="no service for $addr while 8 processes hold the device"$'\n'
  else
    before=$(awk '{print $14 + $15}' "/proc/$pid/stat")  # utime + stime, clock ticks (proc(5))
    sleep 3
    after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    echo "service CPU while idle: $((after - before)) ticks in 3 s"
    [ $((after - before)) -le 2 ] || problems+="the idle service used $((after - before)) clock ticks in 3 s"$'\n'
  fi
  kill "${holders[@]}" 2>/dev/null; wait "${holders[@]}" 2>/dev/null
  junit_check sixty_four_processes "$problems"
}

case_service_open_files() {
  local addr log="$WORK/nofile" problems="" pid
  addr=$(random_loopback)
  # The first process starts the service, which inherits its limits.
  (ulimit -Sn 64 && exec "$UROCE" run --host-device --addr "$addr" -- ibv_asyncwatch -d uroce0) >/dev/null 2>&1 &
  local -a holders=($!)
  for _ in $(seq 1 100); do pid=$(service_pid "$addr"); [ -n "$pid" ] && break; sleep 0.05; done
  if [ -z "$pid" ]; then
    problems+="no service for $addr"$'\n'
  else
    local soft
    soft=$(awk '/^Max open files/ {print $4}' "/proc/$pid/limits")
    [ "$soft" = unlimited ] || [ "$soft" -gt 64 ] || problems+="the service kept a soft limit of $soft open files"$'\n'
  fi
  # 24 more processes holding the device open at once (well past 64 of the service's descriptors), then two pairs.
  local i
  for i in $(seq 1 24); do
    "$UROCE" run --host-device --addr "$addr" -- ibv_asyncwatch -d uroce0 >"$log.holder$i" 2>&1 &
    holders+=($!)
  done
  sleep 2
  for i in $(seq 1 24); do
    kill -0 "${holders[$i]}" 2>/dev/null || problems+="holder $i ended: $(tail -n 2 "$log.holder$i" | tr '\n' ' ')"$'\n'
  done
  run_pairs "$log" "$addr" 2
  problems+="$PROBLEMS"
  kill "${holders[@]}" 2>/dev/null; wait "${holders[@]}" 2>/dev/null
  junit_check service_open_files "$problems"
}

case_xrc_between_processes() {
  local addr port log="$WORK/xrc" problems="" server i
  addr=$(random_loopback)
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" --stats -- "$XRC_CHECK" >"$log.check" 2>&1 ||
    problems+="xrc_share_check: exit $?: $(grep 'xrc_share_check' "$log.check" | grep -v ': ok$')"$'\n'
  awk '/^xrc_pieces_handed / && $2 > 0 {h = 1} /^xrc_pieces_received / && $2 > 0 {r = 1} END {exit !(h && r)}' \
    "$log.check" || problems+="xrc_share_check: no message went from one process's target QP to another's SRQ"$'\n'
  # ibv_open_qp(3) of another process's target QP, which lives on while the opener holds it.
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- "$XRC_CHECK" open >"$log.open" 2>&1 ||
    problems+="xrc_share_check open: exit $?: $(grep 'xrc_share_check' "$log.open" | grep -v ': ok$')"$'\n'
  # The server's reply to client i goes through client (i + 1) mod 3's target QP, naming client i's SRQ.
  port=$(free_tcp_port)
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- \
    ibv_xsrq_pingpong -d uroce0 -g 0 -c 3 -n 200 -p "$port" >"$log.server" 2>&1 &
  server=$!
  wait_listening "$port" "$server"
  local -a clients=()
  for i in 0 1 2; do
    timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" --stats -- \
      ibv_xsrq_pingpong -d uroce0 -g 0 -n 200 -p "$port" "$addr" >"$log.client$i" 2>&1 &
    clients+=($!)
  done
  wait "$server" || problems+="ibv_xsrq_pingpong server: exit $?: $(tail -3 "$log.server")"$'\n'
  for i in 0 1 2; do
    wait "${clients[$i]}" || problems+="ibv_xsrq_pingpong client $i: exit $?: $(grep -v '^[a-z_]* [0-9]*$' \
      "$log.client$i" | tail -3)"$'\n'
  done
  grep -q '^success' "$log.server" || problems+="ibv_xsrq_pingpong server: no success"$'\n'
  cat "$log".client* | awk '/^xrc_pieces_handed / && $2 > 0 {h = 1} END {exit !h}' ||
    problems+="ibv_xsrq_pingpong: no reply crossed from one client's target QP to another client's SRQ"$'\n'
  junit_check xrc_between_processes "$problems"
}

# ibv_open_qp(3) with the sender on another host: xrc_share_check open, creator and opener on A's address, the
# initiator in B (it enters B's namespace and opens B's host device): its one XRC_SEND QP reaches both SRQs of A
# through the one target QP, which the kernel steers to the creator's own socket.
case_xrc_open_across_hosts() {
  local name=xrc_open_across_hosts log="$WORK/xrc_hosts" problems=""
  if [ "$(id -u)" -ne 0 ]; then junit_skip "$name" "network namespaces need root"; return; fi
  two_hosts_up "uroce-hd-$$" || { junit_fail "$name" "could not make the namespaces: $TWO_HOSTS_ERROR"; return; }
  ip netns exec "$HOST_A" timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$ADDR_A" --stats -- \
    "$XRC_CHECK" open "/run/netns/$HOST_B" "$ADDR_B" >"$log" 2>&1 ||
    problems+="xrc_share_check open: exit $?: $(grep 'xrc_share_check' "$log" | grep -v ': ok$')"$'\n'
  # The creator's counters: the initiator's requests came from B to its own socket (not through the service).
  awk '/^host_device_steered_received / && $2 >= 16 {ok = 1} END {exit !ok}' "$log" ||
    problems+="no process got the other host's requests on its own socket"$'\n'
  two_hosts_down
  junit_check "$name" "$problems"
}

case_service_killed_is_device_fatal() {
  local addr log="$WORK/killed" problems="" port
  addr=$(random_loopback)
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- ibv_asyncwatch -d uroce0 >"$log.watch" 2>&1 &
  local watch=$!
  port=$(free_tcp_port)
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- \
    ibv_rc_pingpong -d uroce0 -g 0 -n 100000000 -p "$port" >"$log.server" 2>&1 &
  local server=$!
  wait_listening "$port" "$server"
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- \
    ibv_rc_pingpong -d uroce0 -g 0 -n 100000000 -p "$port" "$addr" >"$log.client" 2>&1 &
  local client=$!
  # A client whose receives are posted to an XRC SRQ, waiting for replies from a server that waits for a second
  # client first: IBTA leaves an SRQ's WQEs queued when a QP fails, so a lost device must flush them itself
  # (emu::Device::Fail), or the client waits for ever. (The server waits in accept(2): not the device's to end.)
  local srq_port
  srq_port=$(free_tcp_port)
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- \
    ibv_xsrq_pingpong -d uroce0 -g 0 -c 2 -n 10 -p "$srq_port" >"$log.srq_server" 2>&1 &
  local srq_server=$!
  wait_listening "$srq_port" "$srq_server"
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- \
    ibv_xsrq_pingpong -d uroce0 -g 0 -n 10 -p "$srq_port" "$addr" >"$log.srq_client" 2>&1 &
  local srq_client=$!
  sleep 1
  local pid
  pid=$(service_pid "$addr")
  if [ -z "$pid" ]; then
    problems+="no service for $addr"$'\n'
  else
    kill -9 "$pid"
  fi
  # The clients fail, and soon: their QPs and SRQs are flushed (no hang until the test's timeout).
  local start=$SECONDS rc side
  for side in client server srq_client; do
    wait "${!side}"; rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] ||
      problems+="$side exit status $rc after the service died: $(tail -n 3 "$log.$side" | tr '\n' ' ')"$'\n'
  done
  [ $((SECONDS - start)) -le 20 ] || problems+="the clients took $((SECONDS - start)) s to fail"$'\n'
  grep -q "Work completion error 5" "$log.srq_client" ||  # IBV_WC_WR_FLUSH_ERR
    problems+="the SRQ client: $(tail -n 3 "$log.srq_client" | tr '\n' ' ')"$'\n'
  kill "$srq_server" 2>/dev/null; wait "$srq_server" 2>/dev/null
  for _ in $(seq 1 50); do grep -q IBV_EVENT_DEVICE_FATAL "$log.watch" && break; sleep 0.1; done
  grep -q "event_type IBV_EVENT_DEVICE_FATAL" "$log.watch" ||
    problems+="ibv_asyncwatch saw no IBV_EVENT_DEVICE_FATAL: $(cat "$log.watch")"$'\n'
  kill "$watch" 2>/dev/null; wait "$watch" 2>/dev/null
  # The next open starts a new service.
  run_pairs "$log.after" "$addr" 1
  problems+="$PROBLEMS"
  junit_check service_killed_is_device_fatal "$problems"
}

case_no_listener_is_refused() {
  local addr log="$WORK/refused" problems="" port start
  addr=$(random_loopback)
  port=$(free_tcp_port)
  start=$SECONDS
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- rdma_client -s "$addr" -p "$port" >"$log.rc" 2>&1
  grep -q "rdma_connect: Connection refused" "$log.rc" || problems+="rdma_client: $(tr '\n' ' ' <"$log.rc")"$'\n'
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- udaddy -s "$addr" -b "$addr" >"$log.ud" 2>&1
  grep -q "RDMA_CM_EVENT_UNREACHABLE, error: 1" "$log.ud" || problems+="udaddy: $(tr '\n' ' ' <"$log.ud")"$'\n'
  [ $((SECONDS - start)) -le 10 ] || problems+="refusing the two took $((SECONDS - start)) s"$'\n'
  junit_check no_listener_is_refused "$problems"
}

case_dead_process_is_a_dead_peer() {
  local addr log="$WORK/dead" problems="" port
  addr=$(random_loopback)
  port=$(free_tcp_port)
  # rdma_verify's client keeps a window of operations in flight, so the survivor always has work the dead peer
  # would have to acknowledge (a side that only waits for a receive learns nothing of its peer's death, on any HCA).
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- \
    "$RDMA_VERIFY" --role=server --port="$port" --seed=3 >"$log.server" 2>&1 &
  local server=$!
  wait_listening "$port" "$server"
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- \
    "$RDMA_VERIFY" --role=client --port="$port" --host="$addr" --ops=100000000 --seed=3 >"$log.client" 2>&1 &
  local client=$!
  sleep 1
  pkill -9 -f "rdma_verify --role=server --port=$port "
  wait "$server" 2>/dev/null
  local rc start=$SECONDS
  wait "$client"; rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || problems+="client exit status $rc after its peer died"$'\n'
  [ $((SECONDS - start)) -le 20 ] || problems+="the client took $((SECONDS - start)) s to fail"$'\n'
  grep -q "completed with transport retry counter exceeded (12)" "$log.client" ||
    problems+="the client did not fail with RETRY_EXC_ERR: $(tail -n 3 "$log.client")"$'\n'
  junit_check dead_process_is_a_dead_peer "$problems"
}

case_dead_process_ends_its_rdma_cm_connections() {
  local addr log="$WORK/cm_dead" problems="" port server start
  addr=$(random_loopback)
  port=$(free_tcp_port)
  # stdout and stderr apart: rping's events (stdout) and its errors (stderr) flushed into one file can cut a line.
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- rping -s -a "$addr" -v -d -p "$port" \
    >"$log.server1" 2>"$log.server1.err" &
  server=$!
  wait_listening "$port" "$server"
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- "$CM_QUITTER" "$addr" "$port" >"$log.quitter" 2>&1
  grep -q "REQ sent" "$log.quitter" || problems+="cm_quitter: $(tr '\n' ' ' <"$log.quitter")"$'\n'
  start=$SECONDS
  wait "$server"
  # REJECTED; or, when the dead client's REJ came before rping's rdma_accept, that accept refused (EINVAL), as the
  # kernel's CM refuses a REP for a connection a REJ has ended.
  grep -q "RDMA_CM_EVENT_REJECTED\|rdma_accept: Invalid argument" "$log.server1" "$log.server1.err" ||
    problems+="the quitter's server: $(cat "$log.server1" "$log.server1.err" | grep -v "ping data" | tail -n 5 |
      tr '\n' ' ')"$'\n'
  [ $((SECONDS - start)) -le 5 ] || problems+="the quitter's server took $((SECONDS - start)) s to end"$'\n'

  port=$(free_tcp_port)
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- rping -s -a "$addr" -v -d -p "$port" -C 100000000 \
    >"$log.server2" 2>"$log.server2.err" &
  server=$!
  wait_listening "$port" "$server"
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- rping -c -a "$addr" -p "$port" -C 100000000 \
    >"$log.client" 2>&1 &
  local client=$!
  for _ in $(seq 1 100); do grep -q "ping data" "$log.server2" && break; sleep 0.05; done
  pkill -9 -f "rping -c -a $addr -p $port " || problems+="no rping client to kill"$'\n'
  start=$SECONDS
  wait "$server"
  wait "$client" 2>/dev/null
  grep -q "RDMA_CM_EVENT_DISCONNECTED" "$log.server2" ||
    problems+="the killed client's server: $(cat "$log.server2" "$log.server2.err" | grep -v "ping data" | tail -n 3 |
      tr '\n' ' ')"$'\n'
  [ $((SECONDS - start)) -le 5 ] || problems+="the killed client's server took $((SECONDS - start)) s to end"$'\n'
  junit_check dead_process_ends_its_rdma_cm_connections "$problems"
}

case_bad_control_messages() {
  local addr log="$WORK/bad" problems="" port
  addr=$(random_loopback)
  # A process holds the device (and its service) while a stranger writes garbage to the service's socket.
  port=$(free_tcp_port)
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- \
    ibv_rc_pingpong -d uroce0 -g 0 -e -c -s 4096 -n 200 -p "$port" >"$log.server" 2>&1 &
  local server=$!
  wait_listening "$port" "$server"
  local answers
  answers=$(/usr/bin/python3 - "$addr" <<'PY'
import socket, struct, sys
name = b"\0uroce/device/v1/" + sys.argv[1].encode()
def ask(payload):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(5)
    s.connect(name)
    s.send(payload)
    try:
        reply = s.recv(64)
    except socket.timeout:
        return "timeout"
    if len(reply) != 24:
        return "closed" if not reply else "len%d" % len(reply)
    magic, version, kind, status = struct.unpack("=IHHi", reply[:12])
    return "%d:%d" % (kind, status)
msg = lambda kind, value=0: struct.pack("=IHHiIQ", 0x75724456, 1, kind, 0, 0, value)
print(ask(b"garbage"))                       # not a control message
print(ask(msg(1)))                           # a hello without the socket to forward on
print(ask(msg(3, 0x1061d2f)))                # a listen before joining
print(ask(struct.pack("=IHHiIQ", 0xdeadbeef, 1, 1, 0, 0, 0)))  # wrong magic
print(ask(msg(77)))                          # unknown type
PY
)
  [ "$answers" = $'5:22\n2:22\n5:22\n5:22\n5:22' ] || problems+="the service answered: $answers"$'\n'
  timeout "$TIMEOUT" "$UROCE" run --host-device --addr "$addr" -- \
    ibv_rc_pingpong -d uroce0 -g 0 -e -c -s 4096 -n 200 -p "$port" "$addr" >"$log.client" 2>&1 ||
    problems+="client after the garbage: exit $?: $(tail -n 5 "$log.client")"$'\n'
  wait "$server" || problems+="server: exit $?: $(tail -n 5 "$log.server")"$'\n'
  junit_check bad_control_messages "$problems"
}

main() {
  rm -rf "$WORK"
  mkdir -p "$WORK"
  make_prefix
  case_pairs_share_one_address
  case_same_host_paths
  case_faults_through_the_rings
  case_direct_access
  case_imports_across_processes
  case_xrc_between_processes
  case_xrc_open_across_hosts
  case_ucx_direct
  case_two_hosts_eight_processes_each
  case_sixty_four_processes
  case_mpi_two_hosts ucx
  case_mpi_two_hosts ofi
  case_the_default_device
  case_gid_table_follows_the_host
  case_rdma_cm_on_every_gid
  case_ipv6_gids_beside_ipv4
  case_libfabric_one_address msg
  case_libfabric_one_address rdm
  case_pyverbs_rdmacm
  case_service_open_files
  case_service_killed_is_device_fatal
  case_no_listener_is_refused
  case_dead_process_is_a_dead_peer
  case_dead_process_ends_its_rdma_cm_connections
  case_bad_control_messages
  junit_report host_device_test
}

main "$@"
