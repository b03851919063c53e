package fleet

import (
	"errors"
	"fmt"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/trust"
)

// ackVerdict is the verdict on one host's status commit: whether it may
// ack deletes, kept while the host branch's tip and the Host's agentKey
// stay the same.
type ackVerdict struct {
	tip, key string
	// why is "" when the commit is signed by the key, else why its acks
	// are not taken (naming the commit, for the log and the forged acks);
	// brief says the same without naming a commit, for the summary, so
	// that a host whose every heartbeat is unsigned does not change the
	// summary with each one. retry is set when the commit could not be
	// read (the next pass verifies it again).
	why, brief string
	retry      bool
}

// ForgedAck is an ack the controller did not act on: the host's status
// lists the destroy (or the volume as absent) at an epoch that would
// finalize the tombstone, but the status commit is not signed by the key
// the Host's spec.agentKey names.
type ForgedAck struct {
	// Ref is "VM web-01@hv-a" or "Volume data@hv-a".
	Ref string
	// Commit is the host branch's tip ("" for a status read from the
	// status branch's old layout); Reason says why it was not taken.
	Commit string
	Reason string
}

// ackRefusal is why a host's status may not ack deletes: its commit (""
// when read from the status branch) and the reason.
type ackRefusal struct{ commit, why string }

// authenticate decides which hosts' statuses may ack deletes (docs/
// DESIGN.md, "Authentic acks"): a host whose Host object (in fl, else the
// last good fleet) names spec.agentKey acks only through a status commit
// on its host branch signed by that key; a host whose Host object left
// the desired state, by the last agentKey l kept for it (l is the ledger
// the pass computes on: the authentic one, read before this is called).
// It returns host → why its acks are not taken, for every host whose status fails; a host without
// agentKey is not checked. Verdicts are kept by (tip, key): a tip is
// verified once. A commit that cannot be read is not taken this pass,
// never treated as signed.
func (c *Controller) authenticate(fl *desired.Fleet, l *snapshots.Ledger, reports []status.Report, hostTips map[string]string) map[string]ackRefusal {
	if fl == nil {
		fl = c.loadedFleet
	}
	out := map[string]ackRefusal{}
	kept := make(map[string]ackVerdict, len(c.ackVerdicts))
	for _, rep := range reports {
		key := agentKey(fl, l, rep.Host)
		if rep.Status == nil || key == "" {
			continue
		}
		tip := hostTips[rep.Host]
		v, ok := c.ackVerdicts[rep.Host]
		if !ok || v.tip != tip || v.key != key || v.retry {
			why, brief, retry := c.verifyAck(rep.Host, tip, key)
			v = ackVerdict{tip: tip, key: key, why: why, brief: brief, retry: retry}
			if v.why != "" {
				c.log.WithField("host", rep.Host).WithField("commit", desired.Hash(tip).Short()).WithField("reason", v.why).
					Warn("host status not signed by the Host's agentKey: its acks and its epoch are not acted on")
			}
		}
		kept[rep.Host] = v
		if v.why != "" {
			out[rep.Host] = ackRefusal{commit: tip, why: v.why}
		}
	}
	c.ackVerdicts = kept
	return out
}

// agentKey is the key host's acks must be signed with: its Host's
// spec.agentKey in fl, or, for a host that left the desired state, the
// last one l, the ledger the pass computes on, kept for it
// (keepAgentKeys); "" when neither names one.
func agentKey(fl *desired.Fleet, l *snapshots.Ledger, host string) string {
	if fl != nil && fl.Hosts[host] != nil {
		return fl.Hosts[host].Spec.AgentKey
	}
	if l != nil && l.Hosts[host] != nil {
		return l.Hosts[host].AgentKey
	}
	return ""
}

// unsignedNote is why host's status commit is not signed by its Host's
// agentKey, naming no commit (status.HostSummary.Unsigned); "" when it
// is, or when no key judges it.
func (c *Controller) unsignedNote(host string) string {
	return c.ackVerdicts[host].brief
}

// verifyAck checks that tip, the tip of host's branch, is signed by key;
// "" when it is, else why not, and briefly, without naming the commit.
// retry is true when the commit could not be read: no verdict, only this
// pass's refusal.
func (c *Controller) verifyAck(host, tip, key string) (why, brief string, retry bool) {
	if tip == "" {
		why = fmt.Sprintf("the status was read from %s (the old layout), which the host's agent does not sign; it must write %s, signed", c.cfg.StatusBranch, status.HostBranch(host))
		return why, why, false
	}
	keys, err := trust.ParseKeys(fmt.Sprintf("Host %s spec.agentKey", host), []string{key})
	if err != nil {
		return err.Error(), err.Error(), false // validated on load; kept safe all the same
	}
	signers, err := trust.New(keys, nil)
	if err != nil {
		return err.Error(), err.Error(), false
	}
	sc, err := c.hosts.Signed(tip)
	if err != nil {
		return fmt.Sprintf("the status commit %s could not be read to verify it: %v", desired.Hash(tip).Short(), err),
			"its status commit could not be read to verify it", true
	}
	// An agentKey has no validity bounds: any time judges it alike.
	if _, err := signers.Verify(sc, c.clock()); err != nil {
		switch {
		case errors.Is(err, trust.ErrUnsigned):
			brief = "the commit carries no signature"
		case errors.Is(err, trust.ErrUnknownKey):
			brief = "the commit is signed by another key"
		case errors.Is(err, trust.ErrSignature):
			brief = "the commit's signature does not verify"
		default:
			return err.Error(), "its status commit could not be verified", true
		}
		return fmt.Sprintf("not signed by the key the Host's spec.agentKey names (%v)", err), brief, false
	}
	return "", "", false
}
