#!/bin/sh
# udhcpc event script of the gitfleet tiny guest.
case "$1" in
bound|renew)
	ifconfig "$interface" "$ip" netmask "${subnet:-255.255.255.0}" up
	for r in $router; do route add default gw "$r" dev "$interface"; break; done
	echo "tinyguest: lease $interface ip=$ip router=$router"
	for r in $router; do
		if ping -c 1 -W 3 "$r" >/dev/null 2>&1; then echo "tinyguest: ping $r ok"; else echo "tinyguest: ping $r failed"; fi
		break
	done
	;;
deconfig)
	ifconfig "$interface" 0.0.0.0
	;;
esac
exit 0
