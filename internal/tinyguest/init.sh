#!/bin/sh
# /init of the gitfleet tiny guest: a busybox-static initramfs that proves a
# VM booted with its seed, disks and network. Every line it prints starts
# with "tinyguest: " so a host can find it in the serial log.
export PATH=/bin:/sbin
/bin/busybox --install -s /bin
mount -t devtmpfs devtmpfs /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
say() { echo "tinyguest: $*"; }
say "init $(uname -r)"

while read -r mod; do
	[ -n "$mod" ] && insmod "/lib/modules/$mod.ko" 2>/dev/null
done </etc/modules

# Wait for the virtio disks to show up (at most ~10 s).
n=0
while [ ! -e /sys/block/vda ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
sleep 0.2

mkdir -p /seed
seeddev=""
for d in /sys/block/vd*; do
	dev=/dev/${d##*/}
	if mount -t iso9660 -o ro "$dev" /seed 2>/dev/null || mount -t vfat -o ro "$dev" /seed 2>/dev/null; then
		if [ -f /seed/meta-data ]; then seeddev=$dev; break; fi
		umount /seed
	fi
done
if [ -n "$seeddev" ]; then
	iid=$(sed -n 's/^instance-id: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' /seed/meta-data)
	hn=$(sed -n 's/^local-hostname: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' /seed/meta-data)
	[ -n "$hn" ] && hostname "$hn"
	say "seed $seeddev instance-id=$iid hostname=$hn"
else
	say "seed none"
fi

for d in /sys/block/vd*; do
	serial=$(cat "$d/serial" 2>/dev/null)
	say "disk ${d##*/} serial=$serial bytes=$(( $(cat "$d/size") * 512 ))"
done

# Power button: an ACPI powerdown from the host turns the guest off.
for ev in /sys/class/input/event*; do
	if [ "$(cat "$ev/device/name" 2>/dev/null)" = "Power Button" ]; then
		node=/dev/input/${ev##*/}
		( n=0; while [ ! -c "$node" ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
		  if dd if="$node" of=/dev/null bs=24 count=1 2>/dev/null; then
			say "power button"; sync; poweroff -f
		  fi ) &
	fi
done

ifconfig lo 127.0.0.1 up
if ifconfig eth0 up 2>/dev/null; then
	say "nic eth0 mac=$(cat /sys/class/net/eth0/address)"
	udhcpc -i eth0 -t 20 -T 1 -n -q -s /etc/udhcpc.script || say "dhcp failed"
else
	say "nic none"
fi
# A root disk (virtio serial gitfleet-root) that begins with
# "tinyguest-silent" makes a boot that never declares itself up: a seed's
# script writes it and reboots, to play a guest that rebooted into a
# system with no sshd, no guest agent and no readiness marker.
for d in /sys/block/vd*; do
	if [ "$(cat "$d/serial" 2>/dev/null)" = gitfleet-root ] && [ "$(head -c 16 "/dev/${d##*/}" 2>/dev/null)" = tinyguest-silent ]; then
		say "silent boot"
		while :; do sleep 3600; done
	fi
done
say "ready"
# gitfleet's console readiness marker (agent.ConsoleReadyMarker): this guest
# runs neither sshd nor a guest agent, so it declares itself up this way.
echo "GITFLEET-GUEST-READY"
# A seed whose user-data is a shell script (#!/bin/sh) gets it run, each
# line it prints as "tinyguest: probe ...": tests probe the guest's view
# of the network this way.
if [ -n "$seeddev" ] && [ "$(head -c 9 /seed/user-data 2>/dev/null)" = '#!/bin/sh' ]; then
	( sh /seed/user-data 2>&1 | while read -r l; do say "probe $l"; done ) &
fi
# Each line typed on the console is answered as "tinyguest: console <line>",
# so a test can prove a console attached to the serial port reaches the
# guest.
while read -r line; do say "console $line"; done
while :; do sleep 3600; done
