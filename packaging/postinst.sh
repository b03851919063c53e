#!/bin/sh
# gitfleet postinst: the system user QEMU drops to (qemu.user in
# agent.yaml), and systemd's view of the units. The services are neither
# enabled nor started, and an upgrade does not restart them: guests keep
# running either way, and `systemctl restart gitfleet-agent` picks up the
# new binary when the operator chooses (docs/operating.md, "Upgrades and version skew").
set -e
if [ "$1" = configure ] || [ "$1" = 1 ] || [ "$1" = 2 ]; then
  if ! getent passwd gitfleet-qemu >/dev/null; then
    useradd --system --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gitfleet-qemu
  fi
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
  fi
fi
exit 0
