package fleet

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// clientHeader tags a benchmark's requests with who sent them: the
// server's CPU is then tallied per client (agent, controller, cli).
const clientHeader = "Gitfleet-Bench-Client"

// serverTally adds up git http-backend's CPU per client and request
// kind (gittest.ServeOptions.Account).
type serverTally struct {
	mu   sync.Mutex
	rows map[string]*tallyRow
}

type tallyRow struct {
	requests int
	cpu      time.Duration
}

func newServerTally() *serverTally { return &serverTally{rows: map[string]*tallyRow{}} }

// key is "client service kind", kind "refs" (the ref advertisement) or
// "pack" (the POST).
func tallyKey(client, service string, advertisement bool) string {
	kind := "pack"
	if advertisement {
		kind = "refs"
	}
	return client + " " + service + " " + kind
}

func (t *serverTally) add(r gittest.Request) {
	client := r.Header.Get(clientHeader)
	if client == "" {
		client = "agent"
	}
	k := tallyKey(client, r.Service, r.Advertisement)
	t.mu.Lock()
	defer t.mu.Unlock()
	row := t.rows[k]
	if row == nil {
		row = &tallyRow{}
		t.rows[k] = row
	}
	row.requests++
	row.cpu += r.CPU
}

// snapshot copies the rows.
func (t *serverTally) snapshot() map[string]tallyRow {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]tallyRow{}
	for k, r := range t.rows {
		out[k] = *r
	}
	return out
}

// since is the rows of now minus those of before; client's sum over every
// service and kind is client's total.
func tallySince(before, now map[string]tallyRow) map[string]tallyRow {
	out := map[string]tallyRow{}
	for k, r := range now {
		b := before[k]
		if d := (tallyRow{requests: r.requests - b.requests, cpu: r.cpu - b.cpu}); d.requests > 0 {
			out[k] = d
		}
	}
	return out
}

// total sums the rows of one client.
func tallyTotal(rows map[string]tallyRow, client string) tallyRow {
	var t tallyRow
	for k, r := range rows {
		if strings.HasPrefix(k, client+" ") {
			t.requests += r.requests
			t.cpu += r.cpu
		}
	}
	return t
}

// logTally logs one line per row, sorted.
func logTally(b *testing.B, rows map[string]tallyRow) {
	keys := make([]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		r := rows[k]
		b.Logf("  server CPU %-28s %6d requests %9.1f ms (%.1f ms each)", k, r.requests, ms(r.cpu), ms(r.cpu)/float64(r.requests))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// tagClients routes the path prefixes /controller and /cli (stripped) to
// next with clientHeader set: one server, three kinds of clients told
// apart.
func tagClients(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, client := range []string{"controller", "cli"} {
			if rest, ok := strings.CutPrefix(r.URL.Path, "/"+client+"/"); ok {
				r.URL.Path = "/" + rest
				r.Header.Set(clientHeader, client)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// cliPusher plays git's command line writing the same shape of commit as
// an agent's heartbeat to the same server: one status file changed in a
// commit that replaces the tip (same parent), pushed with
// --force-with-lease from a clone of the branch — git's own client, for
// the server's CPU per push to compare with.
type cliPusher struct {
	work   string
	pushes int
	n      int
}

// cliBranch is the branch the cli pusher writes (no host reads it).
const cliBranch = "bench/cli"

// newCLIPusher makes the branch (an event, then a heartbeat commit on it,
// as an agent's branch) in the bare repository dir and clones it from url
// (the server's URL for the repository, under /cli/).
func newCLIPusher(b *testing.B, dir, url string) *cliPusher {
	b.Helper()
	name := "hv-cli"
	st := &status.Status{Host: name, Heartbeat: 1, Agent: status.AgentInfo{Version: "bench", BootID: "b", Accel: "tcg"},
		VMs: []status.VM{{Name: "vm-" + name, Phase: status.PhaseReady, Power: "running"}}}
	data, _ := status.Marshal(st)
	gittest.Commit(b, dir, gittest.Edit{Branch: cliBranch, Write: map[string]string{status.Path(name): string(data)}, Message: "status: hv-cli"})
	st.Heartbeat = 2
	data, _ = status.Marshal(st)
	gittest.Commit(b, dir, gittest.Edit{Branch: cliBranch, Write: map[string]string{status.Path(name): string(data)},
		Message: "status: hv-cli heartbeat 2\n\n" + status.HeartbeatTrailer})
	p := &cliPusher{work: filepath.Join(b.TempDir(), "cli"), n: 2}
	if out, err := p.git("", "clone", "--quiet", "--single-branch", "--branch", cliBranch, url, p.work); err != nil {
		b.Fatalf("git clone: %v\n%s", err, out)
	}
	return p
}

// push amends the tip with the next heartbeat and pushes it.
func (p *cliPusher) push(ctx context.Context) error {
	p.n++
	st := &status.Status{Host: "hv-cli", Heartbeat: uint64(p.n), ObservedAt: time.Now().UTC().Truncate(time.Second),
		Agent: status.AgentInfo{Version: "bench", BootID: "b", Accel: "tcg"},
		VMs:   []status.VM{{Name: "vm-hv-cli", Phase: status.PhaseReady, Power: "running"}}}
	data, _ := status.Marshal(st)
	if err := os.WriteFile(filepath.Join(p.work, status.Path("hv-cli")), data, 0o644); err != nil {
		return err
	}
	msg := fmt.Sprintf("status: hv-cli heartbeat %d\n\n%s", p.n, status.HeartbeatTrailer)
	if out, err := p.git(p.work, "commit", "--quiet", "--all", "--amend", "-m", msg); err != nil {
		return fmt.Errorf("git commit: %v\n%s", err, out)
	}
	if out, err := p.git(p.work, "push", "--quiet", "--force-with-lease", "origin", "HEAD:"+cliBranch); err != nil {
		return fmt.Errorf("git push: %v\n%s", err, out)
	}
	p.pushes++
	return nil
}

func (p *cliPusher) git(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=Bench", "GIT_AUTHOR_EMAIL=bench@example.com", "GIT_COMMITTER_NAME=Bench", "GIT_COMMITTER_EMAIL=bench@example.com")
	return cmd.CombinedOutput()
}
