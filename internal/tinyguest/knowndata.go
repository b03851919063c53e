package tinyguest

import "strings"

// KnownDataScript is user-data for the tiny guest that proves a disk's
// data survived a backup, restore or move: at the first boot it writes
// marker (one line, no newline, no shell metacharacters) to 4 KiB at
// 1 MiB of its root disk (serial gitfleet-root) and of its volume (the
// disk whose serial starts with db-01-data), each synced, and prints
// "wrote <marker>"; a boot that finds the marker on the root disk prints
// "found <marker>". Every boot prints the sha256 of both disks' first
// 4 MiB, read inside the guest.
func KnownDataScript(marker string) string {
	return strings.ReplaceAll(knownDataScript, "MARKER", marker)
}

const knownDataScript = `#!/bin/sh
for d in /sys/block/vd*; do
  case "$(cat $d/serial)" in gitfleet-root) root=/dev/${d##*/};; db-01-data*) vol=/dev/${d##*/};; esac
done
if dd if=$root bs=4096 skip=256 count=1 2>/dev/null | grep -q MARKER; then
  echo "found MARKER"
else
  printf 'MARKER\n' > /tmp/m
  dd if=/tmp/m of=$root bs=4096 seek=256 conv=notrunc,sync,fsync 2>/dev/null
  dd if=/tmp/m of=$vol bs=4096 seek=256 conv=notrunc,sync,fsync 2>/dev/null
  echo "wrote MARKER"
fi
echo "hash root $(dd if=$root bs=1M count=4 2>/dev/null | sha256sum | cut -d' ' -f1)"
echo "hash vol $(dd if=$vol bs=1M count=4 2>/dev/null | sha256sum | cut -d' ' -f1)"
`
