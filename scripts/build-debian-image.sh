#!/usr/bin/env bash
# build-debian-image.sh CACHE_DIR
#
# Builds, from Debian packages only, a Debian 12 (bookworm) cloud-style
# guest that gitfleet boots directly (a VM spec's `kernel:` plus `image:`,
# no bootloader, no partition table), and caches it under CACHE_DIR.
#
# The result is the directory CACHE_DIR/debian12-<key>/ holding
#   root.qcow2   the root filesystem: ext4 (label "root") on the whole disk
#   vmlinuz      the guest's kernel (linux-image-cloud-amd64)
#   initrd.img   its initramfs
#   cmdline      the kernel command line to boot it with
#   SHA256SUMS   sha256 of the three artifacts, in sha256sum(1) format
# and the script prints that directory's path as its last line of output.
#
# <key> is the first 16 hex digits of the sha256 of this script's own text
# and of DEBIAN_SUITE, so a change to the package list, the configuration or
# the suite builds a new image and an unchanged script reuses the cached one.
# A build runs in a temporary directory beside the result and is renamed
# into place only when complete; concurrent callers serialize on
# CACHE_DIR/debian12.lock, so none sees a half-built image.
#
# The guest runs cloud-init (NoCloud only, so no datasource probing), with
# the network rendered by netplan to systemd-networkd as in Debian 12's own
# cloud images; openssh-server (host keys are made by cloud-init on first
# boot, never shipped); qemu-guest-agent, started after sshd; sudo. Cloud-init's default user
# is "debian" and receives the seed's ssh_authorized_keys.
#
# Packages come through the host's own apt sources (deb822
# /etc/apt/sources.list.d/debian.sources, else /etc/apt/sources.list), so
# the build reaches the same mirror apt-get does; DEBIAN_MIRROR overrides
# them with one mirror URL. Needs root (mmdebstrap --mode=root, and
# mkfs.ext4 -d must record root ownership), mmdebstrap, mkfs.ext4 (e2fsprogs
# >= 1.43) and qemu-img. No loop device, mount or bootloader is involved.
set -euo pipefail

cache=${1:?usage: build-debian-image.sh CACHE_DIR}
suite=${DEBIAN_SUITE:-bookworm}
size=${DEBIAN_IMAGE_SIZE:-2G}

# The packages of the guest. linux-image-cloud-amd64 is Debian's kernel
# for virtual machines (virtio built in); netplan.io and systemd-resolved
# are what Debian 12's cloud images configure the network with.
packages=(
  systemd-sysv udev dbus
  linux-image-cloud-amd64 initramfs-tools
  cloud-init netplan.io systemd-resolved iproute2
  openssh-server qemu-guest-agent sudo
)

for tool in mmdebstrap mkfs.ext4 qemu-img flock sha256sum; do
  command -v "$tool" >/dev/null || { echo "build-debian-image: $tool is missing (run scripts/install-deps.sh)" >&2; exit 1; }
done
if [ "$(id -u)" -ne 0 ]; then
  echo "build-debian-image: must run as root (mmdebstrap --mode=root, mkfs.ext4 -d keeps file owners)" >&2
  exit 1
fi

self=$(readlink -f "$0")
key=$( { cat "$self"; echo "suite=$suite size=$size"; } | sha256sum | cut -c1-16)
mkdir -p "$cache"
cache=$(readlink -f "$cache")
out="$cache/debian12-$key"

exec 9>"$cache/debian12.lock"
flock 9
if [ -f "$out/SHA256SUMS" ]; then
  echo "$out"
  exit 0
fi

work=$(mktemp -d "$cache/.debian12-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
started=$(date +%s)

sources=()
if [ -n "${DEBIAN_MIRROR:-}" ]; then
  sources=("$DEBIAN_MIRROR")
elif [ -f /etc/apt/sources.list.d/debian.sources ]; then
  sources=(/etc/apt/sources.list.d/debian.sources)
elif [ -s /etc/apt/sources.list ]; then
  sources=(/etc/apt/sources.list)
fi

# What the guest is told at image build time. Everything per-VM (hostname,
# keys, network) comes from the NoCloud seed at first boot.
cat >"$work/customize.sh" <<'EOF'
set -e
root="$1"
cat >"$root/etc/fstab" <<'FSTAB'
LABEL=root / ext4 rw,discard,errors=remount-ro 0 1
FSTAB
cat >"$root/etc/cloud/cloud.cfg.d/90-gitfleet.cfg" <<'CFG'
# gitfleet seeds every guest with a NoCloud ISO (label cidata).
datasource_list: [NoCloud, None]
CFG
# Per-guest identity is made at first boot, never shipped in the image.
rm -f "$root"/etc/ssh/ssh_host_*
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
echo localhost >"$root/etc/hostname"
# gitfleet counts a guest-agent ping as the guest being up; starting the
# agent only once sshd listens (ssh.service is Type=notify) makes "ready"
# imply that SSH answers.
mkdir -p "$root/etc/systemd/system/qemu-guest-agent.service.d"
cat >"$root/etc/systemd/system/qemu-guest-agent.service.d/gitfleet-after-ssh.conf" <<'UNIT'
[Unit]
After=ssh.service
UNIT
# The serial console is the guest's only console; no timers that fetch.
chroot "$root" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer >/dev/null 2>&1 || true
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
EOF

echo "build-debian-image: mmdebstrap $suite into $rootfs" >&2
mmdebstrap --mode=root --variant=minbase --format=directory \
  --include="$(IFS=,; echo "${packages[*]}")" \
  --customize-hook="sh $work/customize.sh \"\$1\"" \
  "$suite" "$rootfs" "${sources[@]}" >&2

mkdir -p "$work/out"
kernel=$(ls "$rootfs"/boot/vmlinuz-* | sort -V | tail -n1)
release=${kernel##*/vmlinuz-}
cp "$kernel" "$work/out/vmlinuz"
cp "$rootfs/boot/initrd.img-$release" "$work/out/initrd.img"
echo "root=/dev/vda rw console=ttyS0 net.ifnames=0" >"$work/out/cmdline"

echo "build-debian-image: mkfs.ext4 -d ($size) and qemu-img convert" >&2
truncate -s "$size" "$work/root.raw"
mkfs.ext4 -q -F -L root -E root_owner=0:0 -d "$rootfs" "$work/root.raw"
qemu-img convert -f raw -O qcow2 "$work/root.raw" "$work/out/root.qcow2"
(cd "$work/out" && sha256sum root.qcow2 vmlinuz initrd.img >SHA256SUMS)

mv -T "$work/out" "$out"
echo "build-debian-image: built $out in $(( $(date +%s) - started ))s (kernel $release)" >&2
echo "$out"
