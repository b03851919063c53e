package qemu

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/gitfleet/gitfleet/desired"
)

// GuestIP is the guest's address on QEMU's user-mode network (slirp hands
// out 10.0.2.15 to the first DHCP client of each VM's private network).
const GuestIP = "10.0.2.15"

// macFor is the MAC of a VM's first NIC when the spec fixes none
// (desired.NICMAC): derived from its name, stable across reboots,
// restarts and hosts, locally administered and unicast.
func macFor(name string) string { return desired.NICMAC(name, 0, desired.NIC{}) }

// macOf is the MAC of VM name's first NIC: the spec's fixed mac when it
// has one, else macFor(name) (desired.NICMAC either way).
func macOf(name, specMAC string) string { return desired.NICMAC(name, 0, desired.NIC{MAC: specMAC}) }

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("allocate ssh port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// portFree reports whether port can be bound on 127.0.0.1 right now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// readPort reads a port file ("2201\n"); 0 when absent.
func readPort(path string) (int, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read ssh port: %w", err)
	}
	p, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || p <= 0 || p > 65535 {
		return 0, fmt.Errorf("read ssh port %s: bad content %q", path, b)
	}
	return p, nil
}
