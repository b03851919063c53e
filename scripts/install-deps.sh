#!/usr/bin/env bash
# Installs what gitfleet's tests and demo need on Debian or Ubuntu: git, QEMU
# (qemu-system-x86 and qemu-utils), busybox-static and a distribution kernel
# package (the tiny test guest boots the host distribution's kernel),
# mmdebstrap and e2fsprogs (the Debian test guest's image),
# qemu-guest-agent (the guest agent's protocol tests), restic, libnbd-bin,
# openssh-server and rclone (backups and their tests), dnsmasq, nftables
# and iproute2 for host networks, systemd-container (systemd-nspawn, the
# test of the shipped systemd units), ovmf, qemu-efi-aarch64, swtpm and
# swtpm-tools (UEFI and TPM guests), and qemu-system-arm with the arm64
# package architecture (the arm64 tiny guest's kernel and busybox-static
# are fetched with apt-get download). Only
# what is missing is installed; apt-get update runs at most once.
set -euo pipefail

need=()
command -v git >/dev/null || need+=(git)
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v qemu-img >/dev/null || need+=(qemu-utils)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
ls /boot/vmlinuz-* >/dev/null 2>&1 || need+=(linux-image-amd64)
command -v make >/dev/null || need+=(make)
# cloud-init: the seed tests read meta-data with its loader and render
# network-config with its net-convert.
dpkg -s cloud-init >/dev/null 2>&1 || need+=(cloud-init)
# Host networks: dnsmasq and nft run nat networks; ip (iproute2) makes the
# network namespaces their tests run in.
command -v dnsmasq >/dev/null || [ -x /usr/sbin/dnsmasq ] || need+=(dnsmasq-base)
command -v nft >/dev/null || [ -x /usr/sbin/nft ] || need+=(nftables)
command -v ip >/dev/null || [ -x /usr/sbin/ip ] || need+=(iproute2)
# The real Debian test guest (scripts/build-debian-image.sh) is built with
# mmdebstrap and mkfs.ext4 -d; qemu-ga is the guest agent the QEMU backend's
# tests talk to on the host.
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v qemu-ga >/dev/null || [ -x /usr/sbin/qemu-ga ] || need+=(qemu-guest-agent)
command -v nft >/dev/null || need+=(nftables)
# Backups: restic is the backup engine; nbdcopy (libnbd-bin) streams a
# disk from QEMU's or qemu-nbd's NBD export to restic in order; sshd
# (openssh-server) and rclone serve the sftp and REST repositories the
# backup tests write to.
command -v restic >/dev/null || need+=(restic)
command -v nbdcopy >/dev/null || need+=(libnbd-bin)
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v rclone >/dev/null || need+=(rclone)
# The systemd units' test boots a Debian tree (scripts/build-systemd-rootfs.sh,
# mmdebstrap) under systemd-nspawn and drives it with nsenter (util-linux).
command -v systemd-nspawn >/dev/null || need+=(systemd-container)
command -v nsenter >/dev/null || need+=(util-linux)
# Signed desired state: the tests sign commits as people do, with an SSH key
# (ssh-keygen) and with a throwaway OpenPGP key (gpg).
command -v ssh-keygen >/dev/null || need+=(openssh-client)
command -v gpg >/dev/null || need+=(gnupg)
# UEFI guests: OVMF and AAVMF with their QEMU firmware descriptors; a TPM:
# swtpm and swtpm_setup; arm64 guests: qemu-system-aarch64.
[ -f /usr/share/qemu/firmware/60-edk2-x86_64.json ] || need+=(ovmf)
[ -f /usr/share/qemu/firmware/60-edk2-aarch64.json ] || need+=(qemu-efi-aarch64)
command -v swtpm >/dev/null || need+=(swtpm)
command -v swtpm_setup >/dev/null || need+=(swtpm-tools)
command -v qemu-system-aarch64 >/dev/null || need+=(qemu-system-arm)
# The arm64 tiny guest's packages (linux-image-arm64, busybox-static) come
# from the arm64 architecture of the same archive.
arm64=0
if command -v dpkg >/dev/null && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  arm64=1
fi

# The agent runs QEMU as this unprivileged system user (agent config
# qemu.user), with an nftables guard keyed on it.
qemu_user() {
  id gitfleet-qemu >/dev/null 2>&1 && return
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo useradd --system --no-create-home --shell /usr/sbin/nologin gitfleet-qemu
}

add_arm64() {
  [ "$arm64" -eq 1 ] || return 0
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo dpkg --add-architecture arm64
  $sudo apt-get update -qq
}

if [ ${#need[@]} -eq 0 ]; then
  add_arm64
  qemu_user
  echo "install-deps: everything is present"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-deps: please install: ${need[*]} (this script knows only apt-get)" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
[ "$arm64" -eq 1 ] && $sudo dpkg --add-architecture arm64
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
qemu_user
