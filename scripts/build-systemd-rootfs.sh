#!/usr/bin/env bash
# build-systemd-rootfs.sh CACHE_DIR
#
# Builds, from Debian packages only, a Debian 12 (bookworm) root filesystem
# that boots under systemd-nspawn with systemd as PID 1, for the test that
# runs gitfleet's shipped units (examples/systemd) under real systemd, and
# caches it under CACHE_DIR.
#
# The result is the directory CACHE_DIR/systemd-rootfs-<key>/ holding
#   rootfs/      the root filesystem (a directory tree, owned by root)
#   PACKAGES     dpkg -l of what it holds
# and the script prints that directory's path as its last line of output.
# Callers copy rootfs/ (cp -a --reflink=auto) or boot it read-only with an
# overlay; the cached tree itself is never booted writable.
#
# <key> is the first 16 hex digits of the sha256 of this script's own text
# and of DEBIAN_SUITE, so a change to the package list or the configuration
# builds a new tree and an unchanged script reuses the cached one. A build
# runs in a temporary directory beside the result and is renamed into place
# only when complete; concurrent callers serialize on
# CACHE_DIR/systemd-rootfs.lock, so none sees a half-built tree.
#
# The tree holds systemd (systemd-sysv, dbus) and what the gitfleet agent
# runs: git (go-git runs git-upload-pack for file:// remotes), QEMU
# (qemu-system-x86, qemu-utils; TCG), nftables (the agent's guard of the
# host against QEMU's user) and the system user gitfleet-qemu that QEMU
# drops to, as scripts/install-deps.sh makes it on a real host. The machine
# id is empty (systemd makes one per boot), no getty runs, and timers that
# fetch are masked: the container reaches no network.
#
# Packages come through the host's own apt sources (deb822
# /etc/apt/sources.list.d/debian.sources, else /etc/apt/sources.list);
# DEBIAN_MIRROR overrides them with one mirror URL. Needs root (mmdebstrap
# --mode=root), mmdebstrap, flock and sha256sum.
set -euo pipefail

cache=${1:?usage: build-systemd-rootfs.sh CACHE_DIR}
suite=${DEBIAN_SUITE:-bookworm}

packages=(
  systemd systemd-sysv dbus
  git ca-certificates
  qemu-system-x86 qemu-utils nftables iproute2
)

for tool in mmdebstrap flock sha256sum; do
  command -v "$tool" >/dev/null || { echo "build-systemd-rootfs: $tool is missing (run scripts/install-deps.sh)" >&2; exit 1; }
done
if [ "$(id -u)" -ne 0 ]; then
  echo "build-systemd-rootfs: must run as root (mmdebstrap --mode=root keeps file owners)" >&2
  exit 1
fi

self=$(readlink -f "$0")
key=$( { cat "$self"; echo "suite=$suite"; } | sha256sum | cut -c1-16)
mkdir -p "$cache"
cache=$(readlink -f "$cache")
out="$cache/systemd-rootfs-$key"

exec 9>"$cache/systemd-rootfs.lock"
flock 9
if [ -f "$out/PACKAGES" ]; then
  echo "$out"
  exit 0
fi

work=$(mktemp -d "$cache/.systemd-rootfs-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
rootfs="$work/out/rootfs"
mkdir -p "$work/out"
started=$(date +%s)

sources=()
if [ -n "${DEBIAN_MIRROR:-}" ]; then
  sources=("$DEBIAN_MIRROR")
elif [ -f /etc/apt/sources.list.d/debian.sources ]; then
  sources=(/etc/apt/sources.list.d/debian.sources)
elif [ -s /etc/apt/sources.list ]; then
  sources=(/etc/apt/sources.list)
fi

cat >"$work/customize.sh" <<'EOF'
set -e
root="$1"
# systemd makes a machine id at each boot; an empty file keeps / read-only-safe.
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
echo gitfleet-host >"$root/etc/hostname"
# The unprivileged user QEMU drops to (-runas), as install-deps.sh makes it.
chroot "$root" useradd --system --no-create-home --shell /usr/sbin/nologin gitfleet-qemu
# Nothing in the container fetches or waits for a console.
chroot "$root" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
  console-getty.service getty@.service systemd-networkd-wait-online.service >/dev/null 2>&1 || true
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
EOF

echo "build-systemd-rootfs: mmdebstrap $suite into $rootfs" >&2
mmdebstrap --mode=root --variant=minbase --format=directory \
  --include="$(IFS=,; echo "${packages[*]}")" \
  --customize-hook="sh $work/customize.sh \"\$1\"" \
  "$suite" "$rootfs" "${sources[@]}" >&2

chroot "$rootfs" dpkg -l >"$work/out/PACKAGES"
mv -T "$work/out" "$out"
echo "build-systemd-rootfs: built $out in $(( $(date +%s) - started ))s" >&2
echo "$out"
