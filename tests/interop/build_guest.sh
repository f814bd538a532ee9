#!/usr/bin/env bash
# Builds the QEMU guest the kernel-rxe interop test boots (tests/interop/rxe_interop_test.cc), or reuses the cached
# one: Debian bookworm's kernel as an uncompressed vmlinux (booted through its PVH entry) and an initramfs holding the
# Debian RDMA clients, kernel rxe and its modules, and an /init that brings up rxe0 and serves a command port.
#
#   build_guest.sh [CACHE_ROOT]     (default $UROCE_GUEST_CACHE, else ~/.cache/uroce-rxe-guest)
#
# Prints the directory holding `vmlinux` and `initramfs.cpio` on stdout. The directory is named by a hash of this
# script and of the versions of every Debian package that goes in, so a new kernel or client version builds a new
# guest and an unchanged one is reused. Exit status: 0 built or reused; 2 not root, or a tool missing (`tools/uroce
# setup` installs them); 3 the packages could not be downloaded (no network); 1 anything else. The last line on stderr
# says why.
#
# Guest interface (kernel command line; the kernel hands unknown key=value words to /init as its environment):
#   uroce_addr=A.B.C.D/N   address of eth0      uroce_cmd_port=P   TCP port of the command shell (busybox nc -ll -e)
#   uroce_mtu=N            MTU of eth0 (default the driver's)
#   uroce_run=PATH         instead of the shell: run PATH (added to the initramfs by the caller) once rxe0 is up,
#                          its output on the console, then print "uroce-guest: done" and power off
# /init prints "uroce-guest: ready" on the console once rxe0 is up and the command port listens.
set -euo pipefail
# Test runners (Bazel) give a minimal PATH; depmod and modprobe live in /sbin.
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

SUITE=bookworm
MIRRORS=(
  "deb http://deb.debian.org/debian $SUITE main"
  "deb http://deb.debian.org/debian $SUITE-updates main"
  "deb http://deb.debian.org/debian-security $SUITE-security main"
)
USERLAND=(libc6 libstdc++6 liburing2 busybox-static kmod iproute2 ibverbs-utils ibverbs-providers rdmacm-utils perftest)
# libstdc++6: for the host-built tests/rdma_verify the test adds at boot; liburing2: for uroce's libraries, which
# `tools/uroce bench vs-rxe` adds at boot to run beside rxe in the guest.
# rdma_rxe pulls ib_core, ib_uverbs, udp tunnels; rxe's ICRC is CRC-32 through the crypto API (crc32_generic).
MODULES=(virtio_pci virtio_net crc32_generic rdma_rxe rdma_ucm)

say() { printf 'build_guest: %s\n' "$*" >&2; }
die() { local code="$1"; shift; say "$*"; exit "$code"; }

[ "$(id -u)" -eq 0 ] || die 2 "needs root (mmdebstrap and depmod write a root filesystem)"
for tool in mmdebstrap apt-get apt-cache dpkg depmod modprobe cpio xz sha256sum flock; do
  command -v "$tool" >/dev/null || die 2 "$tool is not installed (tools/uroce setup installs it)"
done

CACHE_ROOT="${1:-${UROCE_GUEST_CACHE:-$HOME/.cache/uroce-rxe-guest}}"
SELF="$(readlink -f "${BASH_SOURCE[0]}")"

# One apt-cache call (each loads the whole cache: seconds on a busy machine): the versions of everything that goes in,
# and the kernel package linux-image-amd64 depends on.
package_info() {
  apt-cache show --no-all-versions linux-image-amd64 "${USERLAND[@]}" 2>/dev/null | grep -E '^(Package|Version|Depends):'
}
kernel_package() {  # from package_info: linux-image-amd64's "Depends: linux-image-6.1.0-N-amd64 (= V)"
  awk '/^Package:/ {p = $2} p == "linux-image-amd64" && /^Depends:/ {print $2; exit}'
}

INFO=$(package_info)
KPKG=$(kernel_package <<<"$INFO")
if [ -z "$KPKG" ]; then
  say "no linux-image-amd64 in the package lists; running apt-get update"
  apt-get update -q >/dev/null 2>&1 || die 3 "apt-get update failed (no network?)"
  INFO=$(package_info)
  KPKG=$(kernel_package <<<"$INFO")
  [ -n "$KPKG" ] || die 1 "apt-cache knows no linux-image-amd64"
fi

key_input() {
  sha256sum "$SELF"
  echo "$INFO"
}
KEY=$(key_input | sha256sum | cut -c1-16)
OUT="$CACHE_ROOT/$KEY"
if [ -f "$OUT/done" ]; then
  touch "$OUT/done"  # last used: guests unused for a week are pruned when a new one is built
  echo "$OUT"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
# One builder at a time per cache (two test runs may start together).
exec 9>"$CACHE_ROOT/.lock"
flock 9
if [ -f "$OUT/done" ]; then
  echo "$OUT"
  exit 0
fi

WORK=$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
say "building the guest in $OUT (kernel $KPKG; a few minutes, once)"

# --- kernel and modules ---
(cd "$WORK" && apt-get download -q "$KPKG" >/dev/null 2>&1) || {
  say "apt-get download $KPKG failed; refreshing the package lists once"
  apt-get update -q >/dev/null 2>&1 || die 3 "apt-get update failed (no network?)"
  (cd "$WORK" && apt-get download -q "$KPKG" >/dev/null 2>&1) || die 3 "apt-get download $KPKG failed (no network?)"
}
mkdir "$WORK/kernel"
dpkg -x "$WORK"/"$KPKG"_*.deb "$WORK/kernel"
KVER=$(ls "$WORK/kernel/lib/modules")
VMLINUZ="$WORK/kernel/boot/vmlinuz-$KVER"
[ -f "$VMLINUZ" ] || die 1 "no $VMLINUZ in $KPKG"

# The bzImage wraps the kernel ELF as an xz stream (CONFIG_KERNEL_XZ): find its magic FD 37 7A 58 5A 00 and decompress
# that stream; QEMU boots the ELF through its PVH note.
offset=$(LC_ALL=C grep -obaP '\xFD7zXZ\x00' "$VMLINUZ" | head -n1 | cut -d: -f1)
[ -n "$offset" ] || die 1 "no xz stream in $VMLINUZ"
tail -c +"$((offset + 1))" "$VMLINUZ" | xz -dc --single-stream >"$WORK/vmlinux" 2>/dev/null || true
[ "$(head -c4 "$WORK/vmlinux" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || die 1 "the xz payload of $VMLINUZ is not an ELF"

# --- userland ---
say "mmdebstrap --variant=extract ${USERLAND[*]}"
mmdebstrap --quiet --mode=root --variant=extract --include="$(IFS=,; echo "${USERLAND[*]}")" \
  "$SUITE" "$WORK/root" "${MIRRORS[@]}" >"$WORK/mmdebstrap.log" 2>&1 || {
  tail -n 20 "$WORK/mmdebstrap.log" >&2
  die 3 "mmdebstrap failed (no network?)"
}
ROOT="$WORK/root"
rm -rf "$ROOT/usr/share/doc" "$ROOT/usr/share/man" "$ROOT/usr/share/locale" "$ROOT/usr/share/info" \
  "$ROOT/var/cache/apt" "$ROOT/var/lib/apt/lists"

# Only the modules the guest loads, with their dependencies (modprobe --show-depends over the full tree).
depmod -b "$WORK/kernel" "$KVER"
mkdir -p "$ROOT/lib/modules/$KVER"
cp "$WORK/kernel/lib/modules/$KVER"/modules.{builtin,builtin.modinfo,order} "$ROOT/lib/modules/$KVER/"
for m in "${MODULES[@]}"; do
  modprobe -d "$WORK/kernel" -S "$KVER" --show-depends "$m" || die 1 "module $m not found in $KPKG"
done | awk '$1 == "insmod" {print $2}' | sort -u | while read -r path; do
  rel="${path#"$WORK/kernel"}"
  mkdir -p "$ROOT$(dirname "$rel")"
  cp "$path" "$ROOT$rel"
done
depmod -b "$ROOT" "$KVER"

# --variant=extract runs no maintainer scripts: no /bin/sh, no /sbin/modprobe.
ln -sf busybox "$ROOT/bin/sh"
ln -sf /bin/kmod "$ROOT/sbin/modprobe"
mkdir -p "$ROOT/proc" "$ROOT/sys" "$ROOT/dev" "$ROOT/tmp" "$ROOT/run"
cat >"$ROOT/init" <<'EOF'
#!/bin/busybox sh
# busybox's sh prefers its own applets: name the Debian tools by path.
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
for m in virtio_pci virtio_net crc32_generic rdma_rxe rdma_ucm; do /sbin/modprobe "$m" || echo "uroce-guest: modprobe $m failed"; done
/bin/ip link set lo up
/bin/ip addr add "$uroce_addr" dev eth0
[ -z "${uroce_mtu:-}" ] || /bin/ip link set eth0 mtu "$uroce_mtu"
/bin/ip link set eth0 up
/usr/bin/rdma link add rxe0 type rxe netdev eth0 || echo "uroce-guest: rdma link add failed"
cd /tmp
if [ -n "${uroce_run:-}" ]; then
  "$uroce_run" </dev/null 2>&1
  echo "uroce-guest: done"
  /bin/busybox poweroff -f
fi
/bin/busybox nc -ll -p "$uroce_cmd_port" -e /bin/sh &
# "ready" only once the shell's port is in the LISTEN state (0A, include/net/tcp_states.h); nc listens on IPv6 (::)
# when it can, so look in both tables.
listen=":$(printf %04X "$uroce_cmd_port") [0-9A-F]*:0000 0A"
tries=0
while ! grep -q "$listen" /proc/net/tcp /proc/net/tcp6 && [ $tries -lt 600 ]; do usleep 50000; tries=$((tries + 1)); done
echo "uroce-guest: ready"
wait
EOF
chmod 755 "$ROOT/init"

(cd "$ROOT" && find . | LC_ALL=C sort | cpio --quiet -o -H newc) >"$WORK/initramfs.cpio"

mkdir -p "$OUT.tmp"
mv "$WORK/vmlinux" "$WORK/initramfs.cpio" "$OUT.tmp/"
echo "$KPKG $KVER" >"$OUT.tmp/kernel-version"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
touch "$OUT/done"
find "$CACHE_ROOT" -mindepth 2 -maxdepth 2 -name 'done' -mtime +7 -printf '%h\0' | xargs -0r rm -rf
say "guest ready: $(du -sh "$OUT" | cut -f1) in $OUT"
echo "$OUT"
