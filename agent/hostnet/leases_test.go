package hostnet

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// A destroyed VM's lease goes with it, from dnsmasq's lease file and its
// memory: the next VM given its address leases it. (dnsmasq logged "not
// using configured address 10.77.0.7 because it is leased to <the
// destroyed VM's MAC>", and the new guest got no address.)
func TestADestroyedVMsLeaseGoesWithIt(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	nets := f.labNet("10.114.0.0/24")
	macA, macB := mustMAC("52:54:00:01:14:01"), mustMAC("52:54:00:01:14:02")
	ga := f.tapGuest(nets, "vm-a", macA.String(), "a", netip.Addr{})
	addr := f.dhcp(ga)
	leases := filepath.Join(f.dir, "networks", "lab", LeasesFile)
	if got, _ := leaseFor(leases, macA); got != addr {
		t.Fatalf("vm-a's lease %s; want %s (the checks below prove nothing)", got, addr)
	}
	if err := f.m.Detach("vm-a"); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if b, _ := os.ReadFile(leases); strings.Contains(string(b), macA.String()) {
		t.Errorf("vm-a's lease outlived its Detach:\n%s", b)
	}
	gb := f.tapGuest(nets, "vm-b", macB.String(), "b", addr)
	if ip, _, _, out := f.lease(gb); ip != addr {
		t.Errorf("vm-b, reserved vm-a's old %s, leased %v:\n%s\ndnsmasq's log:\n%s", addr, ip, out, f.logTail())
	}
	if err := f.m.Unleased("lab", macB); err != nil {
		t.Errorf("Unleased(vm-b) = %v; want nil once it leased", err)
	}
}

// logTail is the end of network lab's dnsmasq log.
func (f *fixture) logTail() string {
	b, _ := os.ReadFile(filepath.Join(f.dir, "networks", "lab", DnsmasqLog))
	return string(b[max(0, len(b)-2000):])
}

// Unleased says whether a guest holds the lease of its reserved address,
// and when another MAC holds it, which.
func TestUnleasedNamesTheMACHoldingTheAddress(t *testing.T) {
	m, err := New(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	hosts := map[string]reservation{
		"vm-b": {MAC: "52:54:00:00:00:0b", Addr: netip.MustParseAddr("10.77.0.7")},
		"vm-c": {MAC: "52:54:00:00:00:0c", Addr: netip.MustParseAddr("10.77.0.8")},
		"vm-d": {MAC: "52:54:00:00:00:0d", Addr: netip.MustParseAddr("10.77.0.9")},
	}
	if err := m.writeHosts("lab", hosts); err != nil {
		t.Fatal(err)
	}
	later, past := time.Now().Add(time.Hour).Unix(), time.Now().Add(-time.Minute).Unix()
	os.WriteFile(filepath.Join(m.netDir("lab"), LeasesFile), []byte(fmt.Sprintf(
		"%d 52:54:00:00:00:0a 10.77.0.7 vm-a *\n%d 52:54:00:00:00:0c 10.77.0.8 vm-c *\n%d 52:54:00:00:00:0e 10.77.0.9 vm-e *\n",
		later, later, past)), 0o600)
	for _, c := range []struct {
		mac  string
		want error
		says string
	}{
		{"52:54:00:00:00:0b", ErrAddressHeld, "address 10.77.0.7 reserved for MAC 52:54:00:00:00:0b on network lab is leased to another MAC 52:54:00:00:00:0a"},
		{"52:54:00:00:00:0c", nil, ""},
		{"52:54:00:00:00:0d", ErrNoLease, "no lease of address 10.77.0.9 for MAC 52:54:00:00:00:0d on network lab"}, // the other lease ended
		{"52:54:00:00:00:0f", ErrNoLease, "reserves no address for MAC 52:54:00:00:00:0f"},
	} {
		err := m.Unleased("lab", mustMAC(c.mac))
		if !errors.Is(err, c.want) || c.want != nil && !strings.Contains(err.Error(), c.says) {
			t.Errorf("Unleased(%s) = %v; want %v saying %q", c.mac, err, c.want, c.says)
		}
	}
}

// Leases of addresses no longer reserved for their MAC are dropped from
// the lease file before dnsmasq starts; the others, and lines that are no
// IPv4 lease, stay as they were.
func TestPruneLeasesKeepsOnlyReservedOnes(t *testing.T) {
	m, err := New(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	m.writeHosts("lab", map[string]reservation{
		"vm-b": {MAC: "52:54:00:00:00:0b", Addr: netip.MustParseAddr("10.77.0.7")},
		"vm-c": {MAC: "52:54:00:00:00:0c", Addr: netip.MustParseAddr("10.77.0.9")},
	})
	path := filepath.Join(m.netDir("lab"), LeasesFile)
	os.WriteFile(path, []byte("duid 00:01:00:01\n"+
		"1700000000 52:54:00:00:00:0a 10.77.0.7 vm-a *\n"+ // a destroyed VM's, at an address reserved now for another
		"1700000000 52:54:00:00:00:0B 10.77.0.7 vm-b 01:52:54:00:00:00:0b\n"+
		"1700000000 52:54:00:00:00:0c 10.77.0.8 vm-c *\n"), 0o600) // an address vm-c no longer has
	if err := m.pruneLeases("lab"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if want := "duid 00:01:00:01\n1700000000 52:54:00:00:00:0B 10.77.0.7 vm-b 01:52:54:00:00:00:0b\n"; string(got) != want {
		t.Errorf("lease file after pruning:\n%s\nwant\n%s", got, want)
	}
}
