package hostnet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/desired"
)

// What keeps a network's guests from working is read from the host as
// it is now, never from what the Manager made: another firewall, a route,
// a missing bridge can appear at any time after a network was made.

// healthTimeout bounds the nft listing of one Health call.
const healthTimeout = 10 * time.Second

// maxRulesetBytes bounds the nft listing Health reads (16 MiB: a host
// with Docker and a few hundred containers lists some hundred KiB).
const maxRulesetBytes = 16 << 20

// bridgeCallIPTables is the sysctl that, set to 1 (br_netfilter loaded),
// sends IPv4 frames bridged between two ports of a bridge through the
// ip and inet families' forward hook, where any drop there drops them.
const bridgeCallIPTables = "/proc/sys/net/bridge/bridge-nf-call-iptables"

// Health says, for each network of nets (a Host spec's networks, name ->
// definition), what on this host now keeps its guests' traffic from
// flowing, "" when nothing it checks does:
//
//   - its bridge is missing (a bridge network's, or a nat network's
//     own, which the next Reconcile makes again);
//   - a nat network's CIDR overlaps one of the host's routes (a VPN's
//     added after the network was made, say);
//   - a base chain of another nftables table (not the Manager's) on the
//     forward hook drops what it does not accept — its policy is drop, or
//     it holds a drop or reject rule that matches nothing or matches the
//     network's bridge by name — and no rule of that chain accepts the
//     bridge by name (Docker's "ip filter FORWARD" policy drop; an
//     iptables-nft FORWARD DROP is the same chain): a nat network's
//     routed traffic passes the ip and inet families' chains, every
//     network's bridged frames the bridge family's, and, while
//     bridge-nf-call-iptables is 1, the ip and inet ones too.
//
// Several reasons are joined with "; ". A check that cannot be made (nft
// missing or failing) is a reason of its own, naming why. Health changes
// nothing. Safe for concurrent use.
func (m *Manager) Health(ctx context.Context, nets map[string]desired.Network) map[string]string {
	out := make(map[string]string, len(nets))
	if len(nets) == 0 {
		return out
	}
	chains, listErr := m.forwardChains(ctx)
	callIPT := bridgeCallsIPTables()
	for _, name := range sortedKeys(nets) {
		def := nets[name]
		var why []string
		bridge := def.Bridge
		if def.NAT != nil {
			bridge = desired.ManagedBridgePrefix + name
		}
		if _, err := bridgeLink(bridge); err != nil {
			why = append(why, fmt.Sprintf("bridge %s is missing", bridge))
		}
		if def.NAT != nil {
			if prefix, err := def.NAT.Prefix(); err == nil {
				if err := hostConflict(prefix, m.ours(name)); err != nil {
					why = append(why, strings.TrimSuffix(err.Error(), " ("+ErrHostConflict.Error()+")"))
				}
			}
		}
		if listErr != nil {
			why = append(why, "cannot check the host's forward firewall: "+listErr.Error())
		}
		for _, c := range chains {
			routed := c.family == "ip" || c.family == "inet"
			if c.family != "bridge" && !(routed && (def.NAT != nil || callIPT)) {
				continue
			}
			if d := c.drops(bridge); d != "" {
				w := fmt.Sprintf("table %s %s chain %s on the forward hook %s", c.family, c.table, c.name, d)
				if routed && def.NAT == nil {
					w += " (bridge-nf-call-iptables is 1: frames bridged on " + bridge + " pass it)"
				}
				why = append(why, w)
			}
		}
		out[name] = strings.Join(why, "; ")
	}
	return out
}

// bridgeCallsIPTables reports whether bridged IPv4 frames pass the ip and
// inet forward hooks (bridgeCallIPTables is 1); false when br_netfilter
// is not loaded.
func bridgeCallsIPTables() bool {
	b, err := os.ReadFile(bridgeCallIPTables)
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

// forwardChain is a base chain on the forward hook of a table the Manager
// does not own, with its rules' verdicts.
type forwardChain struct {
	family, table, name string
	policyDrop          bool
	rules               []ruleVerdict
}

// ruleVerdict is one rule of a forwardChain: its verdict (accept, drop,
// reject; "" for another) and the interface names it matches on
// (iifname, oifname with "=="), none when it matches on nothing else
// either (unconditional).
type ruleVerdict struct {
	verdict       string
	ifnames       []string
	unconditional bool
}

// drops says how chain c drops the traffic of bridge, "" when it does
// not (or accepts it by name first).
func (c forwardChain) drops(bridge string) string {
	for _, r := range c.rules {
		names := r.ifnames
		ours := false
		for _, n := range names {
			if n == bridge {
				ours = true
			}
		}
		switch {
		case r.verdict == "accept" && ours:
			return ""
		case (r.verdict == "drop" || r.verdict == "reject") && (r.unconditional || ours):
			return "has a " + r.verdict + " rule that matches " + map[bool]string{true: "every packet", false: "bridge " + bridge}[r.unconditional]
		}
	}
	if c.policyDrop {
		return "has policy drop"
	}
	return ""
}

// forwardChains lists the base chains on the forward hook of every
// nftables table but the Manager's own (named NftTable or starting with
// it), from `nft -j list ruleset`, bounded by healthTimeout and
// maxRulesetBytes.
func (m *Manager) forwardChains(ctx context.Context) ([]forwardChain, error) {
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	if m.cfg.Nft == "" {
		return nil, errors.New("nft is not installed")
	}
	cmd := exec.CommandContext(ctx, m.cfg.Nft, "-j", "list", "ruleset")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &limitedBuffer{b: &stdout, max: maxRulesetBytes}, &limitedBuffer{b: &stderr, max: 4096}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("nft -j list ruleset: %v: %s", err, trim(stderr.Bytes()))
	}
	return parseForwardChains(stdout.Bytes())
}

// parseForwardChains reads nft's JSON listing (libnftables-json(5)).
func parseForwardChains(data []byte) ([]forwardChain, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("nft -j list ruleset: %w", err)
	}
	type key struct{ family, table, chain string }
	byKey := map[key]*forwardChain{}
	var order []key
	for _, obj := range doc.Nftables {
		if raw, ok := obj["chain"]; ok {
			var c struct {
				Family, Table, Name, Hook, Policy string
			}
			if json.Unmarshal(raw, &c) != nil || c.Hook != "forward" || strings.HasPrefix(c.Table, NftTable) {
				continue
			}
			k := key{c.Family, c.Table, c.Name}
			byKey[k] = &forwardChain{family: c.Family, table: c.Table, name: c.Name, policyDrop: c.Policy == "drop"}
			order = append(order, k)
		}
		if raw, ok := obj["rule"]; ok {
			var r struct {
				Family, Table, Chain string
				Expr                 []map[string]json.RawMessage
			}
			if json.Unmarshal(raw, &r) != nil {
				continue
			}
			if c := byKey[key{r.Family, r.Table, r.Chain}]; c != nil {
				c.rules = append(c.rules, ruleOf(r.Expr))
			}
		}
	}
	out := make([]forwardChain, 0, len(order))
	for _, k := range order {
		out = append(out, *byKey[k])
	}
	sort.SliceStable(out, func(i, j int) bool {
		return out[i].family+out[i].table+out[i].name < out[j].family+out[j].table+out[j].name
	})
	return out, nil
}

// ruleOf reads one rule's expressions: its verdict, the interface names
// it matches, and whether it matches anything at all.
func ruleOf(exprs []map[string]json.RawMessage) ruleVerdict {
	var r ruleVerdict
	matches := 0
	for _, e := range exprs {
		for op, raw := range e {
			switch op {
			case "accept", "drop", "reject":
				r.verdict = op
			case "match":
				matches++
				var mt struct {
					Op    string          `json:"op"`
					Left  json.RawMessage `json:"left"`
					Right json.RawMessage `json:"right"`
				}
				if json.Unmarshal(raw, &mt) != nil {
					continue
				}
				var left struct {
					Meta struct{ Key string } `json:"meta"`
				}
				var name string
				if json.Unmarshal(mt.Left, &left) == nil && (left.Meta.Key == "iifname" || left.Meta.Key == "oifname") &&
					(mt.Op == "==" || mt.Op == "in") && json.Unmarshal(mt.Right, &name) == nil {
					r.ifnames = append(r.ifnames, name)
				}
			}
		}
	}
	r.unconditional = matches == 0
	return r
}

// limitedBuffer keeps at most max bytes written to it and fails past
// them, which ends the command writing.
type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if l.b.Len()+len(p) > l.max {
		return 0, fmt.Errorf("more than %d bytes", l.max)
	}
	return l.b.Write(p)
}
