package hostnet

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/desired"
)

// NftTable is the nftables table the Manager owns ("inet gitfleet"). Only
// the Manager writes it; it is replaced whole on every change.
const NftTable = "gitfleet"

// renderNftables is the whole "inet gitfleet" table for the nat networks
// nets (name -> CIDR), as one nft script that replaces the table
// atomically: declaring the table first makes "delete" succeed when it
// does not exist yet, and nft applies a script as one transaction.
//
// Per network: guests reach the host itself only for DHCP, DNS and ping
// (input); the host's replies and the guests' own traffic are forwarded,
// nothing from outside — another nat network's guests included — starts
// a connection to a guest (forward); what
// leaves the network is masqueraded (postrouting).
func renderNftables(nets map[string]string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\n", NftTable, NftTable)
	if len(nets) == 0 {
		return []byte(b.String())
	}
	fmt.Fprintf(&b, "table inet %s {\n", NftTable)
	b.WriteString("\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n")
	for _, name := range sortedKeys(nets) {
		br := desired.NATBridge(name)
		fmt.Fprintf(&b, "\t\tiifname %q ct state established,related accept\n", br)
		fmt.Fprintf(&b, "\t\tiifname %q udp dport { 53, 67 } accept\n", br)
		fmt.Fprintf(&b, "\t\tiifname %q tcp dport 53 accept\n", br)
		fmt.Fprintf(&b, "\t\tiifname %q icmp type echo-request accept\n", br)
		fmt.Fprintf(&b, "\t\tiifname %q drop\n", br)
	}
	b.WriteString("\t}\n")
	b.WriteString("\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n")
	// Into a network first, for every network, then out of one: a
	// guest's own traffic, accepted on the way out, must not be accepted
	// into another nat network before that network's rules see it.
	for _, name := range sortedKeys(nets) {
		br := desired.NATBridge(name)
		fmt.Fprintf(&b, "\t\toifname %q ct state established,related accept\n", br)
		fmt.Fprintf(&b, "\t\toifname %q drop\n", br)
	}
	for _, name := range sortedKeys(nets) {
		br := desired.NATBridge(name)
		fmt.Fprintf(&b, "\t\tiifname %q ip saddr %s accept\n", br, nets[name])
		fmt.Fprintf(&b, "\t\tiifname %q drop\n", br)
	}
	b.WriteString("\t}\n")
	b.WriteString("\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n")
	for _, name := range sortedKeys(nets) {
		fmt.Fprintf(&b, "\t\tip saddr %s ip daddr != %s masquerade\n", nets[name], nets[name])
	}
	b.WriteString("\t}\n}\n")
	return []byte(b.String())
}

// ensureNftables loads the table for every nat network this Manager made
// (their spec files) when it differs from the one last loaded, or when the
// kernel's table is not the one loaded then: missing (a host reboot, a
// flush) or changed by anyone else (a chain flushed, a rule added or
// removed), since its drop rules are what keeps guests off the host. The
// kernel's listing of the table as loaded is kept beside the script
// (NftablesListFile) to compare with.
func (m *Manager) ensureNftables(ctx context.Context) error {
	made, err := m.natNetworks()
	if err != nil {
		return err
	}
	nets := map[string]string{}
	for _, name := range made {
		var s natSpec
		if err := readJSON(filepath.Join(m.netDir(name), SpecFile), &s); err != nil {
			return err
		}
		nets[name] = s.CIDR
	}
	want := renderNftables(nets)
	file, listFile := filepath.Join(m.cfg.Dir, NftablesFile), filepath.Join(m.cfg.Dir, NftablesListFile)
	have, _ := os.ReadFile(file)
	loaded, _ := os.ReadFile(listFile)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	live, present := m.listNftables(ctx)
	switch {
	case !bytes.Equal(have, want):
	case len(nets) == 0 && !present:
		return nil
	case len(nets) > 0 && present && bytes.Equal(live, loaded):
		return nil
	}
	cmd := exec.CommandContext(ctx, m.cfg.Nft, "-f", "-")
	cmd.Stdin = bytes.NewReader(want)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nftables: %v: %s", err, trim(out))
	}
	if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
		return err
	}
	live, _ = m.listNftables(ctx)
	if err := writeFile(listFile, live); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if err := writeFile(file, want); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if present && bytes.Equal(have, want) {
		m.log.WithField("networks", len(nets)).Warn("nftables table changed by someone else; loaded again")
		return nil
	}
	m.log.WithField("networks", len(nets)).Info("nftables table loaded")
	return nil
}

// listNftables is the kernel's listing of the table, and whether it
// exists.
func (m *Manager) listNftables(ctx context.Context) ([]byte, bool) {
	out, err := exec.CommandContext(ctx, m.cfg.Nft, "list", "table", "inet", NftTable).Output()
	if err != nil {
		return nil, false
	}
	return out, true
}
