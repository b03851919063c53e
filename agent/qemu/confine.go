package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/agent/hostnet"
)

// DefaultQEMUUser is the system user the agent runs QEMU as unless its
// config says otherwise; the install step creates it.
const DefaultQEMUUser = "gitfleet-qemu"

// sandboxArgs is QEMU's seccomp sandbox: no obsolete system calls, no
// process spawning, no changes to scheduling or resource limits. With
// -runas QEMU itself calls setuid once, after which it holds no privilege
// to elevate (and NoNewPrivs is set), so set*uid stays allowed; without it
// set*uid is denied.
func sandboxArgs(runAs bool) []string {
	elevate := "deny"
	if runAs {
		elevate = "allow"
	}
	return []string{"-sandbox", "on,obsolete=deny,elevateprivileges=" + elevate + ",spawn=deny,resourcecontrol=deny"}
}

// qemuUser is the unprivileged user QEMU runs as.
type qemuUser struct {
	name     string
	uid, gid int
}

// lookupQEMUUser resolves Config.RunAs: "" is DefaultQEMUUser for an
// agent running as root, else nil (QEMU runs as the agent's own user);
// "root" is nil. Any other name must be an unprivileged user.
func lookupQEMUUser(name string) (*qemuUser, error) {
	switch {
	case name == "root":
		return nil, nil
	case name == "" && os.Geteuid() != 0:
		return nil, nil
	case name == "":
		name = DefaultQEMUUser
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("qemu user %q: %w (create it: useradd --system --no-create-home --shell /usr/sbin/nologin %s)", name, err, name)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, fmt.Errorf("qemu user %q: uid %q", name, u.Uid)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, fmt.Errorf("qemu user %q: gid %q", name, u.Gid)
	}
	if uid == 0 {
		return nil, fmt.Errorf("qemu user %q is root: want an unprivileged user", name)
	}
	return &qemuUser{name: name, uid: uid, gid: gid}, nil
}

// claim makes the VM's directory the agent's again when an earlier
// version gave it to QEMU's user (claimDir), logging what it took back.
func (p *Provisioner) claim(st *vmState) error {
	removed, err := claimDir(st.dir)
	if len(removed) > 0 {
		p.log.WithField("vm", st.name).WithField("removed", removed).
			Warn("took the VM's directory back from QEMU's user and removed what was planted at the backend's names")
	}
	return err
}

// guardTable is the nftables table that keeps guests off the host.
func guardTable(uid int) string { return "gitfleet_guard_" + strconv.Itoa(uid) }

// IPv6's link-local range, and the IPv6 address of the EC2 metadata
// service: guests reach neither through the host, nor IPv4's link-local
// range (hostnet.LinkLocal4). A link-local address is never routed, so all
// a guest finds there through the host is the host's own link, where a
// cloud's metadata service (169.254.169.254) answers the host's requests
// with the host's credentials.
const (
	LinkLocal6   = "fe80::/10"
	MetadataAWS6 = "fd00:ec2::254"
)

// guardRules is the nftables script of installGuard: new connections that
// QEMU's user opens to any address of this host (loopback included) are
// refused, except DNS, which user-mode networking relays to the host's
// resolver; so are those to link-local addresses and the metadata
// service (hostnet.LinkLocal4 and the rest). Connections to the guest's forwarded port come in to QEMU and
// are established, so the guest's own forward keeps working, and so do
// connections to any other host.
func guardRules(uid int) string {
	t := guardTable(uid)
	newConn := "    meta skuid " + strconv.Itoa(uid) + " ct state new"
	return strings.Join([]string{
		"table inet " + t + " {}",
		"delete table inet " + t,
		"table inet " + t + " {",
		"  chain output {",
		"    type filter hook output priority 0; policy accept;",
		newConn + " fib daddr type local udp dport 53 accept",
		newConn + " fib daddr type local tcp dport 53 accept",
		newConn + " fib daddr type local reject",
		newConn + " ip daddr " + hostnet.LinkLocal4 + " reject",
		newConn + " ip6 daddr { " + LinkLocal6 + ", " + MetadataAWS6 + " } reject",
		"  }",
		"}",
	}, "\n") + "\n"
}

// installGuard loads guardRules into the network namespace the agent runs
// in (with nft). QEMU's user-mode networking maps the gateway (10.0.2.2)
// to the host's 127.0.0.1; these rules are what keeps a guest off the
// host's loopback services (the controller's /metrics, other guests' SSH
// forwards).
func installGuard(ctx context.Context, nft string, uid int) error {
	cmd := exec.CommandContext(ctx, nft, "-f", "-")
	cmd.Stdin = strings.NewReader(guardRules(uid))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("install the guests' loopback guard (nftables table inet %s): %v: %s", guardTable(uid), err, trimTail(out, 1024))
	}
	return nil
}

// GuardHost implements agent.HostGuard: the guests' loopback guard (with a
// QEMU user) is loaded again when missing or changed since it was loaded,
// and so are the host networks' tables (with host networking), whose
// dead dnsmasq processes are started again (hostnet.Manager.Guard).
func (p *Provisioner) GuardHost(ctx context.Context) error {
	var errs []error
	if p.user != nil {
		errs = append(errs, p.ensureGuard(ctx, false))
	}
	if p.cfg.Networks != nil {
		errs = append(errs, p.cfg.Networks.Guard(ctx))
	}
	return errors.Join(errs...)
}

// ensureGuard loads the loopback guard (installGuard) when force is set,
// or when the kernel's listing of its table differs from the one taken
// when it was last loaded (missing, flushed, a rule added), and keeps the
// new listing.
func (p *Provisioner) ensureGuard(ctx context.Context, force bool) error {
	p.guardMu.Lock()
	defer p.guardMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list := func() []byte {
		out, err := exec.CommandContext(ctx, p.cfg.NFT, "list", "table", "inet", guardTable(p.user.uid)).Output()
		if err != nil {
			return nil
		}
		return out
	}
	if !force && p.guardList != nil && bytes.Equal(list(), p.guardList) {
		return nil
	}
	if err := installGuard(ctx, p.cfg.NFT, p.user.uid); err != nil {
		return err
	}
	if !force && p.guardList != nil {
		p.log.WithField("table", guardTable(p.user.uid)).Warn("the guests' loopback guard was removed or changed; loaded again")
	}
	p.guardList = list()
	return nil
}
