package status_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// served is a bare repository (reached through git's own upload-pack and
// receive-pack, the file transport) and an agent's depth-1 clone of it.
func served(t *testing.T) (dir string, repo *gitsource.Repo) {
	t.Helper()
	dir = gittest.NewBare(t)
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: dir, Depth: 1})
	require.NoError(t, err)
	return dir, repo
}

// history lists the messages' first lines of branch, newest first.
func history(t *testing.T, dir, branch string) []string {
	return strings.Split(gittest.Git(t, dir, "log", "--format=%s", branch), "\n")
}

// History grows with events, not with time: a write replaces a
// heartbeat-only tip, every change of what the status says (a phase, an
// ack, an epoch) stays, and the heartbeat always grows.
func TestWriterHistoryGrowsWithEvents(t *testing.T) {
	dir, repo := served(t)
	ctx := context.Background()
	w := &status.Writer{Repo: repo, Host: "hv-a"}
	branch := status.HostBranch("hv-a")
	st := &status.Status{Host: "hv-a", LastSeenEpoch: 1}
	write := func(hb uint64) status.Written {
		t.Helper()
		st.Heartbeat, st.ObservedAt = hb, time.Unix(int64(hb), 0).UTC()
		out, err := w.Write(ctx, st)
		require.NoError(t, err)
		return out
	}
	first := write(1)
	assert.Equal(t, status.Written{Heartbeat: 1, Commit: gittest.Rev(t, dir, branch)}, first, "the first write is an event")
	out := write(2)
	assert.True(t, out.HeartbeatOnly)
	assert.False(t, out.Replaced, "an event tip is never replaced")
	beat2 := out.Commit
	out = write(3)
	assert.True(t, out.HeartbeatOnly && out.Replaced && !out.Reused, "the second heartbeat is a new commit: %+v", out)
	beat3 := out.Commit
	// From then on the branch alternates between the two.
	for hb := uint64(4); hb <= 6; hb++ {
		out = write(hb)
		assert.True(t, out.HeartbeatOnly && out.Replaced && out.Reused, "heartbeat %d: %+v", hb, out)
		want, wantHB := beat2, uint64(2)
		if hb%2 == 1 {
			want, wantHB = beat3, 3
		}
		assert.Equal(t, want, out.Commit, "heartbeat %d", hb)
		assert.Equal(t, wantHB, out.Heartbeat, "heartbeat %d", hb)
		assert.Equal(t, want, gittest.Rev(t, dir, branch))
	}
	assert.Equal(t, []string{"status: hv-a heartbeat 2", "status: hv-a heartbeat 1"}, history(t, dir, branch))
	st.VMs = []status.VM{{Name: "web-01", Phase: status.PhaseReady}}
	out = write(7)
	assert.False(t, out.HeartbeatOnly, "a phase is an event")
	assert.True(t, out.Replaced, "an event replaces a heartbeat-only tip")
	assert.False(t, write(8).Replaced, "an event tip is never replaced")
	st.Destroyed = []string{"old-01"}
	write(9)
	write(10)
	write(11)
	st.LastSeenEpoch = 2
	write(12)
	assert.Equal(t, []string{
		"status: hv-a heartbeat 12", "status: hv-a heartbeat 9", "status: hv-a heartbeat 7", "status: hv-a heartbeat 1",
	}, history(t, dir, branch), "the events alone")
	got, err := status.Parse("x", []byte(gittest.Show(t, dir, branch, status.Path("hv-a"))+"\n"))
	require.NoError(t, err)
	assert.Equal(t, uint64(12), got.Heartbeat)
	assert.Equal(t, []string{"old-01"}, got.Destroyed, "the ack is in the tip")
	// The ack stayed in history too, in the commit that made it.
	assert.Contains(t, gittest.Show(t, dir, branch+"~1", status.Path("hv-a")), "old-01")
	assert.NotContains(t, gittest.Show(t, dir, branch+"~2", status.Path("hv-a")), "old-01")
}

// AppendOnly writes every status as a new commit; so does a Writer whose
// remote refuses non-fast-forward updates, from the refusal on, without
// losing the write that found it.
func TestWriterAppendOnly(t *testing.T) {
	for _, tc := range []struct {
		name       string
		appendOnly bool
		deny       bool
	}{{"configured", true, false}, {"refused by the remote", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir, repo := served(t)
			if tc.deny {
				gittest.Git(t, dir, "config", "receive.denyNonFastForwards", "true")
			}
			w := &status.Writer{Repo: repo, Host: "hv-a", AppendOnly: tc.appendOnly}
			refused := 0
			for hb := uint64(1); hb <= 5; hb++ {
				out, err := w.Write(context.Background(), &status.Status{Host: "hv-a", Heartbeat: hb})
				require.NoError(t, err)
				assert.False(t, out.Replaced)
				if out.Refused {
					refused++
				}
			}
			assert.Equal(t, "5", gittest.Git(t, dir, "rev-list", "--count", status.HostBranch("hv-a")))
			if tc.deny {
				assert.Equal(t, 1, refused, "the refusal is met once")
			}
		})
	}
}

// Migration: a host whose branch does not exist yet continues the
// heartbeat of its file on the old shared status branch, read once.
func TestWriterMigratesFromTheStatusBranch(t *testing.T) {
	dir, repo := served(t)
	ctx := context.Background()
	old, err := status.Marshal(&status.Status{Host: "hv-a", Heartbeat: 40})
	require.NoError(t, err)
	_, err = repo.Update(ctx, status.Branch, func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{status.Path("hv-a"): old}, "old agent", nil
	})
	require.NoError(t, err)
	w := &status.Writer{Repo: repo, Host: "hv-a", OldBranch: status.Branch}
	out, err := w.Write(ctx, &status.Status{Host: "hv-a", Heartbeat: 3})
	require.NoError(t, err)
	assert.Equal(t, uint64(41), out.Heartbeat)
	assert.Contains(t, gittest.Show(t, dir, status.HostBranch("hv-a"), status.Path("hv-a")), "heartbeat: 41")
}

// Host branch names, the trailer, and what counts as heartbeat-only.
func TestHostBranchAndHeartbeatOnly(t *testing.T) {
	for in, want := range map[string]string{
		"gitfleet/hosts/hv-a": "hv-a", "gitfleet/hosts/": "", "gitfleet/hosts/a/b": "", "gitfleet/status": "", "hv-a": "",
	} {
		got, ok := status.HostFromBranch(in)
		assert.Equal(t, want, got, in)
		assert.Equal(t, want != "", ok, in)
	}
	assert.Equal(t, "hv-a", func() string { h, _ := status.HostFromBranch(status.HostBranch("hv-a")); return h }())
	assert.True(t, status.IsHeartbeatOnly("status: hv-a heartbeat 3\n\n"+status.HeartbeatTrailer+"\n"))
	assert.False(t, status.IsHeartbeatOnly("status: hv-a heartbeat 3 "+status.HeartbeatTrailer))
	a := &status.Status{Host: "hv-a", Heartbeat: 1, ObservedAt: time.Unix(1, 0)}
	b := &status.Status{Host: "hv-a", Heartbeat: 9, ObservedAt: time.Unix(9, 0), VMs: []status.VM{}}
	assert.True(t, status.SameExceptHeartbeat(a, b), "heartbeat, observedAt and nil against empty lists")
	for name, change := range map[string]func(*status.Status){
		"phase":   func(s *status.Status) { s.VMs = []status.VM{{Name: "x", Phase: status.PhaseReady}} },
		"ack":     func(s *status.Status) { s.Destroyed = []string{"x"} },
		"epoch":   func(s *status.Status) { s.LastSeenEpoch = 2 },
		"error":   func(s *status.Status) { s.SnapshotError = "refused" },
		"fence":   func(s *status.Status) { s.FenceViolation = true },
		"boot id": func(s *status.Status) { s.Agent.BootID = "b2" },
	} {
		c := *b
		change(&c)
		assert.False(t, status.SameExceptHeartbeat(a, &c), name)
	}
	assert.False(t, status.SameExceptHeartbeat(nil, a))
}

// A directory planted at the host's status path on its branch (anyone who
// can push there may) does not stop the agent's status writes: the status
// file replaces it. Before, every write failed, the heartbeat stopped, and
// the controller counted the host offline.
func TestWriterReplacesAPlantedDirectory(t *testing.T) {
	dir, repo := served(t)
	ctx := context.Background()
	w := &status.Writer{Repo: repo, Host: "hv-a"}
	st := &status.Status{Host: "hv-a", LastSeenEpoch: 1, Heartbeat: 1}
	_, err := w.Write(ctx, st)
	require.NoError(t, err)
	branch := status.HostBranch("hv-a")
	gittest.Commit(t, dir, gittest.Edit{Branch: branch, Remove: []string{status.Path("hv-a")},
		Write: map[string]string{status.Path("hv-a") + "/planted": "x\n"}, Message: "planted"})
	st.Heartbeat, st.VMs = 2, []status.VM{{Name: "web-01", Phase: status.PhaseReady}}
	_, err = w.Write(ctx, st)
	require.NoError(t, err)
	got, err := status.Parse(status.Path("hv-a"), []byte(gittest.Show(t, dir, branch, status.Path("hv-a"))+"\n"))
	require.NoError(t, err)
	assert.Equal(t, uint64(2), got.Heartbeat)
}

// A status pushed by someone else with the largest heartbeat does not
// wrap the agent's next write around to 0: it writes its own counter.
func TestWriterPastTheLargestHeartbeat(t *testing.T) {
	dir, repo := served(t)
	forged, err := status.Marshal(&status.Status{Host: "hv-a", Heartbeat: math.MaxUint64})
	require.NoError(t, err)
	gittest.Commit(t, dir, gittest.Edit{Branch: status.HostBranch("hv-a"), Write: map[string]string{status.Path("hv-a"): string(forged)}})
	w := &status.Writer{Repo: repo, Host: "hv-a"}
	out, err := w.Write(context.Background(), &status.Status{Host: "hv-a", Heartbeat: 19})
	require.NoError(t, err)
	assert.Equal(t, uint64(19), out.Heartbeat)
}

// unreachable counts the objects of the bare repository dir that no ref
// reaches (git fsck --unreachable; a bare repository keeps no reflogs).
func unreachable(t *testing.T, dir string) int {
	out := gittest.Git(t, dir, "fsck", "--unreachable", "--no-reflogs", "--no-progress")
	if out == "" {
		return 0
	}
	return len(strings.Split(out, "\n"))
}

// countingSigner signs every commit with a made-up signature (the git
// server does not verify it) and counts the commits it signed.
type countingSigner struct{ n int }

func (s *countingSigner) SignCommit([]byte) (string, error) {
	s.n++
	return "-----BEGIN SSH SIGNATURE-----\nU1NIU0lH\n-----END SSH SIGNATURE-----\n", nil
}

// Heartbeats leave no garbage on the git server: after the first two,
// an unsigned writer points its branch back and forth between two
// heartbeat commits, so 30 heartbeats leave at most the one heartbeat
// commit not at the tip unreachable (its commit, two trees and blob), and
// the server stores no new object for them. An event drops both; a signed
// writer writes (and signs) a new commit every time, as before.
func TestWriterHeartbeatsLeaveNoGarbage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		signed bool
	}{{"unsigned", false}, {"signed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := gittest.NewBare(t)
			url := gittest.Serve(t, dir+"/..") + "/repo.git"
			repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: url, Depth: 1})
			require.NoError(t, err)
			signer := &countingSigner{}
			w := &status.Writer{Repo: repo, Host: "hv-a"}
			if tc.signed {
				w.Signer = signer
			}
			st := &status.Status{Host: "hv-a", VMs: []status.VM{{Name: "web-01", Phase: status.PhaseReady}}}
			write := func() status.Written {
				t.Helper()
				st.Heartbeat++
				st.ObservedAt = time.Unix(int64(st.Heartbeat), 0).UTC()
				out, err := w.Write(context.Background(), st)
				require.NoError(t, err)
				return out
			}
			write()
			write()
			write()
			loose := gittest.Git(t, dir, "count-objects")
			reused := 0
			for range 30 {
				if write().Reused {
					reused++
				}
			}
			branch := status.HostBranch("hv-a")
			got, err := status.Parse("x", []byte(gittest.Show(t, dir, branch, status.Path("hv-a"))+"\n"))
			require.NoError(t, err)
			assert.True(t, status.SameExceptHeartbeat(got, st), "the tip says what the last write said")
			assert.Equal(t, "2", gittest.Git(t, dir, "rev-list", "--count", branch), "the event and one heartbeat commit")
			if tc.signed {
				assert.Zero(t, reused, "a signed heartbeat is always a new commit")
				assert.Equal(t, 33, signer.n)
				assert.Equal(t, 4*31, unreachable(t, dir), "each of the 31 signed heartbeats replaced leaves its commit, two trees and blob")
				return
			}
			assert.Equal(t, 30, reused)
			assert.Equal(t, loose, gittest.Git(t, dir, "count-objects"), "no object stored for 30 heartbeats")
			assert.Equal(t, 4, unreachable(t, dir), "the heartbeat commit not at the tip, its two trees and blob")
			// An event: both heartbeat commits leave the branch.
			st.VMs[0].Phase = status.PhaseFailed
			out := write()
			assert.False(t, out.HeartbeatOnly || out.Reused)
			assert.Equal(t, 8, unreachable(t, dir), "two heartbeat commits' objects, once per event")
			assert.Greater(t, out.Heartbeat, uint64(33), "a new commit's heartbeat is above every one written")
		})
	}
}
