package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// summarize builds the README.md summary: what the ledger l records, a row
// of every host, the pending deletes beside their hosts' rows, and the VMs
// the hosts run that no one manages.
func (c *Controller) summarize(l *snapshots.Ledger, fl *desired.Fleet, reports []status.Report, forged []ForgedAck, statusOK bool, now time.Time) status.Summary {
	s := c.ledgerSummary(l, forged, now)
	hosts := c.hostRows(l, fl, reports, statusOK, now)
	for _, h := range hosts {
		s.Hosts = append(s.Hosts, *h)
	}
	sort.Slice(s.Hosts, func(i, j int) bool { return s.Hosts[i].Name < s.Hosts[j].Name })
	for _, t := range l.Tombstones {
		s.Pending = append(s.Pending, c.pendingDelete(t, hosts[t.Host]))
	}
	s.Unmanaged = unmanaged(l, fl, reports)
	for i, u := range s.Unmanaged {
		// A host the summary does not list (retired, nothing delivered
		// to it) included: its Host's last agentKey still judges it.
		s.Unmanaged[i].Unsigned = c.unsignedNote(u.Host)
	}
	return s
}

// sweepsShown is how many of the ledger's sweeps, the newest, the summary
// lists.
const sweepsShown = 10

// ledgerSummary is the summary of what l records (the applied and the
// rejected commit, the forged snapshots commits, the retained objects, the
// last sweeps) and of the acks this pass found forged.
func (c *Controller) ledgerSummary(l *snapshots.Ledger, forged []ForgedAck, now time.Time) status.Summary {
	s := status.Summary{Branch: c.cfg.Branch, AbandonGrace: c.cfg.AbandonGrace, ViewAt: now}
	for _, f := range forged {
		s.ForgedAcks = append(s.ForgedAcks, status.ForgedAck{Ref: f.Ref, Commit: desired.Hash(f.Commit), Reason: f.Reason})
	}
	for _, f := range l.ForgedCommits {
		s.ForgedCommits = append(s.ForgedCommits, status.ForgedCommit{Commit: f.Commit, Signed: f.Signed, Reason: f.Reason, At: f.At})
	}
	if l.Applied != nil {
		s.Applied = l.Applied.Commit
	}
	if l.Rejected != nil {
		s.Rejected = &status.Rejection{Commit: l.Rejected.Commit, At: l.Rejected.At, Reason: l.Rejected.Reason,
			SupersededBy: l.Rejected.Superseded}
	}
	for _, k := range l.Retained {
		s.Retained = append(s.Retained, status.RetainedObject{Kind: string(k.Kind), Name: k.Name, Host: k.Host,
			Commit: k.Commit, Since: k.Since})
	}
	sweeps := l.Sweeps
	if len(sweeps) > sweepsShown {
		sweeps = sweeps[len(sweeps)-sweepsShown:]
	}
	for _, w := range sweeps {
		s.Swept = append(s.Swept, status.SweptDelete{Kind: string(w.Kind), Name: w.Name, Host: w.Host,
			Commit: w.Commit, At: w.At, Reason: w.Reason})
	}
	return s
}

// hostRows are the rows of the Hosts table, by name: every host fl
// desires, every host l delivers a snapshot to (every host l knows when fl
// is nil), and every host that reports but one retired and done
// (retiredAndDone). A host is online only when the statuses were read
// (statusOK) and it reported.
func (c *Controller) hostRows(l *snapshots.Ledger, fl *desired.Fleet, reports []status.Report, statusOK bool, now time.Time) map[string]*status.HostSummary {
	hosts := map[string]*status.HostSummary{}
	get := func(name string) *status.HostSummary {
		h := hosts[name]
		if h == nil {
			h = &status.HostSummary{Name: name}
			hosts[name] = h
		}
		return h
	}
	if fl != nil {
		for name := range fl.Hosts {
			get(name)
		}
	}
	for name, rec := range l.Hosts {
		if rec.Hash != "" || fl == nil {
			get(name) // its epoch is set below, with every host's
		}
	}
	for _, rep := range reports {
		if retiredAndDone(l, fl, rep.Host) {
			continue // its VMs, if it runs any, are listed as unmanaged
		}
		c.fillReported(get(rep.Host), l, rep)
	}
	for _, h := range hosts {
		if rec := l.Hosts[h.Name]; rec != nil {
			h.Epoch = rec.Epoch
		}
		if statusOK && h.Reported {
			off, _ := c.live.offline(h.Name, now)
			h.Online = !off
		}
		h.Retired = fl != nil && fl.Hosts[h.Name] == nil
	}
	return hosts
}

// fillReported fills h, the row of rep's host, from rep: the status read
// (marked when its host did not sign it: unsignedNote), or why it could
// not be read.
func (c *Controller) fillReported(h *status.HostSummary, l *snapshots.Ledger, rep status.Report) {
	h.Reported = true
	if rep.Err != nil {
		h.StatusError = rep.Err.Error()
		return
	}
	st := rep.Status
	h.Unsigned = c.unsignedNote(rep.Host)
	h.Heartbeat, h.Accel, h.AgentVersion, h.LastStatus = st.Heartbeat, st.Agent.Accel, st.Agent.Version, st.ObservedAt
	h.LastSeenEpoch, h.FenceViolation, h.VMs = st.LastSeenEpoch, st.FenceViolation, st.VMs
	h.SnapshotError, h.Networks = st.SnapshotError, st.Networks
	h.Quarantined, h.Suspended, h.QuarantinedVolumes = st.Quarantined, st.Suspended, st.QuarantinedVolumes
	h.Unconfirmed = unconfirmed(l, st)
}

// pendingDelete is the row of t, a pending delete, beside h, the row of
// its host (nil when the summary lists none): when the host's quarantine
// destroys the object and whether it waits for a confirmation, taken from
// h only when its host signed its status.
func (c *Controller) pendingDelete(t *snapshots.TombstoneRecord, h *status.HostSummary) status.PendingDelete {
	at, _ := time.Parse(time.RFC3339, t.Tombstone.Time)
	p := status.PendingDelete{Kind: string(t.Kind), Name: t.Name, Host: t.Host,
		Commit: t.Tombstone.Commit, Author: t.Tombstone.Author, Time: at, Epoch: t.Tombstone.Epoch,
		Rewritten: t.Tombstone.Rewritten, Swept: t.SweptAt != nil}
	if !t.PublishedAt.IsZero() {
		p.SweepAt = t.PublishedAt.Add(c.cfg.AbandonGrace).UTC()
	}
	switch {
	case h == nil:
	case h.Unsigned != "":
		p.HostUnverified = true
	default:
		list := h.Quarantined
		if t.Kind == desired.KindVolume {
			list = h.QuarantinedVolumes
		}
		for _, q := range list {
			if q.Name == t.Name {
				p.DestroyAt = q.DestroyAt
				p.Unconfirmed = q.AwaitsConfirmation() && q.Confirm != t.Tombstone.Confirm
			}
		}
	}
	return p
}

// retiredAndDone reports whether host is one the desired state fl no longer
// has and the controller delivers nothing to (no snapshot of it is
// published): its status file, still on the branches, no longer puts it in
// the Hosts table.
func retiredAndDone(l *snapshots.Ledger, fl *desired.Fleet, host string) bool {
	if fl == nil || fl.Hosts[host] != nil {
		return false
	}
	rec := l.Hosts[host]
	return rec == nil || rec.Hash == ""
}

// unmanaged lists the VMs hosts report that neither the desired state nor
// the ledger knows on that host (a repository restored from a backup that
// lacks them, say), and every VM a host reports as vanished (dropped from its
// snapshot without a tombstone): the agents keep them, and the summary says
// so.
func unmanaged(l *snapshots.Ledger, fl *desired.Fleet, reports []status.Report) []status.UnmanagedVM {
	// Every pass renders the summary, so the common case (each reported VM
	// is desired on its host) costs one map lookup per VM; the ledger's
	// lists are only searched for the rare VM the desired state lacks.
	known := func(host, name string) bool {
		if fl != nil {
			if vm, ok := fl.VMs[name]; ok && vm.Spec.Host == host {
				return true
			}
		}
		if rec, ok := l.Hosts[host]; ok && slices.Contains(rec.VMs, name) {
			return true
		}
		for _, t := range l.Tombstones {
			if t.Kind == desired.KindVM && t.Host == host && t.Name == name {
				return true
			}
		}
		for _, k := range l.Retained {
			if k.Kind == desired.KindVM && k.Host == host && k.Name == name {
				return true
			}
		}
		return false
	}
	var out []status.UnmanagedVM
	for _, rep := range reports {
		if rep.Status == nil {
			continue
		}
		for _, vm := range rep.Status.VMs {
			if !known(rep.Host, vm.Name) {
				out = append(out, status.UnmanagedVM{Name: vm.Name, Host: rep.Host, Phase: vm.Phase})
			}
		}
		// A VM the agent's accepted snapshot dropped without a tombstone is
		// reported apart from its VMs, and is kept whatever the ledger says.
		for _, v := range rep.Status.Vanished {
			phase := "vanished, " + v.Power
			if v.Quarantined {
				phase = "vanished, shut down"
			}
			out = append(out, status.UnmanagedVM{Name: v.Name, Host: rep.Host, Phase: phase})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Host != out[j].Host {
			return out[i].Host < out[j].Host
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// writeSummary rewrites README.md (and controller.yaml) on the status
// branch when they changed, copying no host file.
func (c *Controller) writeSummary(ctx context.Context, s status.Summary, now time.Time) (bool, error) {
	return c.writeStatusBranch(ctx, s, statusCopies{}, now)
}

// writeStatusBranch is the controller's one write of the status branch,
// of which it is the only writer: README.md and controller.yaml when they
// changed, and the host files of cp copied from their host branches as
// they are. A change only of heartbeat counters (in the summary or in
// the copies) is held back until SummaryInterval has passed since the last
// write; any other change is written at once, with every copy that lags.
// Every write holds last-write.yaml (status.LastWrite: when), and the branch is
// written after refreshEvery even when nothing changed, so a reader can
// tell a stopped controller's last view. It touches no other file.
func (c *Controller) writeStatusBranch(ctx context.Context, s status.Summary, cp statusCopies, now time.Time) (bool, error) {
	w, err := c.planStatus(s, cp, now)
	if w == nil || err != nil {
		return false, err
	}
	newTip, err := c.update(ctx, c.hosts, c.cfg.StatusBranch, w.mutate)
	if err != nil {
		return false, err
	}
	w.done()
	return newTip != w.base, nil
}

// statusWrite is a write of the status branch planStatus prepared: mutate
// gives the files on the status tip (none when the tip holds them
// already) and records that tip in base; done records the summary as
// written, once the commit is pushed.
type statusWrite struct {
	mutate gitsource.Mutation
	base   string
	done   func()
}

// planStatus prepares writeStatusBranch's write of s and cp; nil when
// there is nothing to write (the summary unchanged, or a change of
// heartbeats only that SummaryInterval holds back: c.summaryDue).
func (c *Controller) planStatus(s status.Summary, cp statusCopies, now time.Time) (*statusWrite, error) {
	data := status.RenderSummary(s)
	if string(data) == string(c.summary) && len(cp.tips) == 0 && !c.refreshDue(now) {
		c.summaryDue = false
		return nil, nil
	}
	key := summaryKey(s)
	heartbeatsOnly := string(key) == string(c.summaryKey) && !cp.event
	if heartbeatsOnly && c.cfg.SummaryInterval > 0 && !c.summaryAt.IsZero() && now.Sub(c.summaryAt) < c.cfg.SummaryInterval {
		c.summaryDue = true
		return nil, nil
	}
	files, err := c.renderStatus(s, data, cp, now)
	if err != nil {
		return nil, err
	}
	w := &statusWrite{done: func() {
		c.summary, c.summaryKey, c.summaryAt, c.summaryDue = data, key, now, false
	}}
	w.mutate = func(tip string, _ func(string) ([]byte, error)) (map[string][]byte, string, error) {
		w.base = tip
		return files.commit(c.hosts, tip)
	}
	return w, nil
}

// statusFiles are the files of a write of the status branch: the
// controller's own, path → content (nil: none), and the copies of the
// hosts' statuses.
type statusFiles struct {
	own, copies map[string][]byte
}

// renderStatus renders the files of a write at now of s, whose rendering
// is data, and of cp.
func (c *Controller) renderStatus(s status.Summary, data []byte, cp statusCopies, now time.Time) (statusFiles, error) {
	copies, err := c.copyFiles(cp)
	if err != nil {
		return statusFiles{}, err
	}
	liveness, err := c.liveness(s)
	if err != nil {
		return statusFiles{}, err
	}
	lw := c.lastWrite(now)
	written, err := status.MarshalLastWrite(lw)
	if err != nil {
		return statusFiles{}, err
	}
	// The README says when it was written; data, which the next pass
	// compares with, does not.
	readme := status.StampSummary(data, lw)
	var failing []byte
	if s.Failing != nil {
		if failing, err = status.MarshalPassFailure(s.Failing); err != nil {
			return statusFiles{}, err
		}
	}
	// controller.yaml is there while passes fail, gone once one succeeds
	// (a nil content removes it). last-write.yaml differs in every write:
	// each commit says when the controller made it.
	own := map[string][]byte{status.SummaryPath: readme, status.ControllerPath: failing,
		status.LivenessPath: liveness, status.LastWritePath: written}
	return statusFiles{own: own, copies: copies}, nil
}

// commit is the files and message of the commit of f on tip, a commit of
// repo's status branch ("" before its first): each of the controller's
// own files tip does not hold as it is, and every copy (the same content
// is no change). None when nothing differs.
func (f statusFiles) commit(repo *gitsource.Repo, tip string) (map[string][]byte, string, error) {
	files := map[string][]byte{}
	for path, want := range f.own {
		ok, err := sameAtTip(repo, tip, path, want)
		if err != nil {
			return nil, "", err
		}
		if !ok {
			files[path] = want
		}
	}
	msg := "Update the fleet summary"
	if len(f.copies) > 0 {
		msg = fmt.Sprintf("Update the fleet summary and %d host status(es)", len(f.copies))
		for path, data := range f.copies {
			files[path] = data // the same content is no change
		}
	}
	if len(files) == 0 {
		return nil, "", nil
	}
	return files, msg, nil
}

// sameAtTip reports whether tip of repo holds want at path (no file there
// when want is nil). The file is read up to the size it should have: a
// bigger one (forged, say) differs, and costs no memory.
func sameAtTip(repo *gitsource.Repo, tip, path string, want []byte) (bool, error) {
	if tip == "" {
		return want == nil, nil
	}
	old, err := repo.ReadFileMax(tip, path, int64(len(want)))
	switch {
	case errors.Is(err, gitsource.ErrFileNotFound):
		return want == nil, nil
	case errors.Is(err, gitsource.ErrFileTooLarge):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	return want != nil && string(old) == string(want), nil
}

// refreshEvery is the longest the controller lets pass between two writes
// of the status branch when nothing changed (status.LastWrite's refresh):
// SummaryInterval, or DefaultSummaryInterval when that is not positive.
func (c *Controller) refreshEvery() time.Duration {
	if c.cfg.SummaryInterval > 0 {
		return c.cfg.SummaryInterval
	}
	return DefaultSummaryInterval
}

// lastWrite is last-write.yaml of a status commit made at now.
func (c *Controller) lastWrite(now time.Time) status.LastWrite {
	return status.LastWrite{At: now, RefreshSeconds: int64(c.refreshEvery() / time.Second)}
}

// refreshDue reports whether the status branch is due a write at now
// although nothing on it changed: this process wrote it refreshEvery ago
// or more. Before its first write, the first pass writes anyway.
func (c *Controller) refreshDue(now time.Time) bool {
	return !c.summaryAt.IsZero() && now.Sub(c.summaryAt) >= c.refreshEvery()
}

// summaryKey renders s with its heartbeat-driven fields (the hosts'
// heartbeat counters) blanked: two summaries with equal keys differ only in
// what agents move on every write, which SummaryInterval may hold back.
func summaryKey(s status.Summary) []byte {
	hosts := make([]status.HostSummary, len(s.Hosts))
	copy(hosts, s.Hosts)
	for i := range hosts {
		hosts[i].Heartbeat = 0
	}
	s.Hosts = hosts
	return status.RenderSummary(s)
}

// liveness is status.Liveness of s, encoded again only when its rows
// differ from the last ones (most writes change no host's state).
func (c *Controller) liveness(s status.Summary) ([]byte, error) {
	rows := status.LivenessStates(s)
	if c.livenessData != nil && slices.Equal(rows, c.livenessRows) {
		return c.livenessData, nil
	}
	data, err := status.MarshalLiveness(rows)
	if err != nil {
		return nil, err
	}
	c.livenessRows, c.livenessData = rows, data
	return data, nil
}

// unconfirmed counts the quarantines of st that wait for a confirmation
// the ledger l has not published: no pending tombstone of the object on
// the host carries the quarantine's nonce.
func unconfirmed(l *snapshots.Ledger, st *status.Status) int {
	published := map[snapshots.Ref]string{}
	for _, t := range l.Tombstones {
		if t.Host == st.Host {
			published[t.Ref()] = t.Tombstone.Confirm
		}
	}
	n := 0
	count := func(kind desired.Kind, qs []status.Quarantine) {
		for _, q := range qs {
			if q.AwaitsConfirmation() && published[snapshots.Ref{Kind: kind, Name: q.Name, Host: st.Host}] != q.Confirm {
				n++
			}
		}
	}
	count(desired.KindVM, st.Quarantined)
	count(desired.KindVolume, st.QuarantinedVolumes)
	return n
}
