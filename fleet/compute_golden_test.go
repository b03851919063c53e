package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/tools/txtar"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/golden"
	"github.com/gitfleet/gitfleet/trust"
)

// TestComputeGolden runs the controller's decision core over the scenarios
// in testdata/compute/*.txt and compares its decisions with the ones
// written there (go test -update rewrites them).
//
// A scenario is a txtar archive: its comment says which rule of
// docs/DESIGN.md (Controller semantics) it pins, and its files are one or
// more passes, numbered from 1, that run in order over one snapshots branch:
//
//	-- ledger.yaml --          the ledger before pass 1 (default: none yet)
//	-- tip/hosts/H.yaml --     a file at the snapshots tip before pass 1
//	-- N/pass --               pass N's clock and history (passConfig, YAML)
//	-- N/desired/PATH --       a file of the desired tree (kept for later passes;
//	                           an empty section removes it)
//	-- N/status/H.yaml --      host H's status (kept; an empty section removes it)
//	-- N/tip/hosts/H.yaml --   a hand edit of the snapshots tip (empty removes it)
//	-- N/ledger.yaml --        the ledger replaced by hand (a restored branch)
//	-- N/out/decisions --      what the pass decided, one line each, or its error
//	-- N/out/ledger.yaml --    the ledger it wrote
//	-- N/out/hosts/H.yaml --   each host file it wrote ("(removed)" for a removal)
//
// The out sections are the expectations; every other section is input. A
// pass that returns an error writes nothing: the next pass starts from the
// same tip.
func TestComputeGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "compute", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scenarios in testdata/compute")
	}
	for _, file := range files {
		name := filepath.Base(file)
		t.Run(strings.TrimSuffix(name, ".txt"), func(t *testing.T) {
			a, err := txtar.ParseFile(file)
			if err != nil {
				t.Fatal(err)
			}
			got := runScenario(t, a)
			if !golden.Update() {
				diffSections(t, a, got)
			}
			golden.Check(t, "compute/"+name, got)
		})
	}
}

// diffSections names each out section of got that differs from the
// scenario a (missing from it, or extra), with both texts, before
// golden.Check shows the whole files.
func diffSections(t *testing.T, a *txtar.Archive, got []byte) {
	t.Helper()
	sections := func(a *txtar.Archive) map[string]string {
		m := map[string]string{}
		for _, f := range a.Files {
			if _, rest, _ := strings.Cut(f.Name, "/"); strings.HasPrefix(rest, "out/") {
				m[f.Name] = string(f.Data)
			}
		}
		return m
	}
	want, have := sections(a), sections(txtar.Parse(got))
	for _, name := range sortedKeys(have) {
		if w, ok := want[name]; !ok {
			t.Errorf("section %s is new:\n%s", name, have[name])
		} else if w != have[name] {
			t.Errorf("section %s differs:\n--- got\n%s--- want\n%s", name, have[name], w)
		}
	}
	for _, name := range sortedKeys(want) {
		if _, ok := have[name]; !ok {
			t.Errorf("section %s is gone:\n%s", name, want[name])
		}
	}
}

// passConfig is the `N/pass` section of a scenario.
type passConfig struct {
	// Now is the controller's clock (RFC 3339).
	Now time.Time `yaml:"now"`
	// Head is the desired-state commit read.
	Head string `yaml:"head"`
	// Branch and Path are the controller's configuration (default main
	// and the repository root).
	Branch *string `yaml:"branch"`
	Path   string  `yaml:"path"`
	// LoadError rejects the desired state with this reason.
	LoadError string `yaml:"loadError"`
	// Rewritten is true when the applied commit is not an ancestor of
	// Head.
	Rewritten bool `yaml:"rewritten"`
	// RemovedBy attributes every delete of the pass (default: Head, by
	// "author <author@example.com>" at Now).
	RemovedBy *snapshots.Tombstone `yaml:"removedBy"`
	// StatusUnreadable is true when the status branch could not be read.
	StatusUnreadable bool `yaml:"statusUnreadable"`
	// Offline maps hosts to how long they have been offline; every other
	// host is online.
	Offline map[string]time.Duration `yaml:"offline"`
	// AbandonGrace defaults to 15m.
	AbandonGrace time.Duration `yaml:"abandonGrace"`
	// MaxDeletes is the mass-delete guard's limit (default
	// DefaultMaxDeletes); Messages are the messages of the commits since
	// the applied one, head first (its trailers).
	MaxDeletes int      `yaml:"maxDeletes"`
	Messages   []string `yaml:"messages"`
	// SignatureError, when set, is the signature verifier's refusal of
	// the head (it wraps trust.ErrSignature).
	SignatureError string `yaml:"signatureError"`
}

// scenario is the state carried from one pass to the next.
type scenario struct {
	t        *testing.T
	ledger   []byte            // nil: no ledger yet
	tip      map[string][]byte // snapshots tip files but the ledger
	desired  map[string][]byte
	statuses map[string][]byte
}

func runScenario(t *testing.T, a *txtar.Archive) []byte {
	sc := &scenario{t: t, tip: map[string][]byte{}, desired: map[string][]byte{}, statuses: map[string][]byte{}}
	out := &txtar.Archive{Comment: a.Comment}
	passes := map[int][]txtar.File{}
	var order []int
	for _, f := range a.Files {
		n, rest, numbered := strings.Cut(f.Name, "/")
		num, err := strconv.Atoi(n)
		if !numbered || err != nil {
			sc.setup(f)
			out.Files = append(out.Files, f)
			continue
		}
		if strings.HasPrefix(rest, "out/") {
			continue
		}
		if passes[num] == nil {
			order = append(order, num)
		}
		passes[num] = append(passes[num], f)
	}
	sort.Ints(order)
	for i, num := range order {
		if num != i+1 {
			t.Fatalf("passes are numbered 1, 2, …: found pass %d after %d", num, i)
		}
		out.Files = append(out.Files, passes[num]...)
		out.Files = append(out.Files, sc.pass(num, passes[num])...)
	}
	return txtar.Format(out)
}

// setup applies a section that precedes the passes.
func (sc *scenario) setup(f txtar.File) {
	switch {
	case f.Name == snapshots.LedgerPath:
		sc.ledger = f.Data
	case strings.HasPrefix(f.Name, "tip/"):
		sc.tip[strings.TrimPrefix(f.Name, "tip/")] = f.Data
	default:
		sc.t.Fatalf("unknown section %q (want ledger.yaml, tip/… or N/…)", f.Name)
	}
}

// putFile sets or (empty data) removes name in m.
func putFile(m map[string][]byte, name string, data []byte) {
	if len(data) == 0 {
		delete(m, name)
		return
	}
	m[name] = data
}

// pass applies pass num's input sections, runs compute and returns its out
// sections.
func (sc *scenario) pass(num int, files []txtar.File) []txtar.File {
	t := sc.t
	var cfg passConfig
	for _, f := range files {
		_, name, _ := strings.Cut(f.Name, "/")
		switch {
		case name == "pass":
			dec := yaml.NewDecoder(bytes.NewReader(f.Data))
			dec.KnownFields(true)
			if err := dec.Decode(&cfg); err != nil {
				t.Fatalf("%s: %v", f.Name, err)
			}
		case name == snapshots.LedgerPath:
			sc.ledger = f.Data
		case strings.HasPrefix(name, "desired/"):
			putFile(sc.desired, strings.TrimPrefix(name, "desired/"), f.Data)
		case strings.HasPrefix(name, "status/"):
			putFile(sc.statuses, strings.TrimPrefix(name, "status/"), f.Data)
		case strings.HasPrefix(name, "tip/"):
			putFile(sc.tip, strings.TrimPrefix(name, "tip/"), f.Data)
		default:
			t.Fatalf("unknown section %q", f.Name)
		}
	}
	if cfg.Now.IsZero() {
		t.Fatalf("pass %d: its pass section needs now", num)
	}
	in := sc.input(num, cfg)
	o, err := compute(in)
	prefix := strconv.Itoa(num) + "/out/"
	if err != nil {
		return []txtar.File{{Name: prefix + "decisions", Data: []byte("error: " + err.Error() + "\n")}}
	}
	ledger, err := o.ledger.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	res := []txtar.File{{Name: prefix + "decisions", Data: decisions(o)}, {Name: prefix + snapshots.LedgerPath, Data: ledger}}
	paths := make([]string, 0, len(o.files))
	for p := range o.files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		data := o.files[p]
		if data == nil {
			res = append(res, txtar.File{Name: prefix + p, Data: []byte("(removed)\n")})
		} else {
			res = append(res, txtar.File{Name: prefix + p, Data: data})
		}
		putFile(sc.tip, p, data)
	}
	sc.ledger = ledger
	return res
}

// input builds compute's input for pass num from the carried state.
func (sc *scenario) input(num int, cfg passConfig) input {
	t := sc.t
	l := snapshots.NewLedger()
	if sc.ledger != nil {
		var err error
		if l, err = snapshots.ParseLedger(sc.ledger); err != nil {
			t.Fatalf("pass %d: %v", num, err)
		}
	}
	branch := "main"
	if cfg.Branch != nil {
		branch = *cfg.Branch
	}
	grace := 15 * time.Minute
	if cfg.AbandonGrace != 0 {
		grace = cfg.AbandonGrace
	}
	in := input{branch: branch, path: cfg.Path, head: desired.Hash(cfg.Head), ledger: l, now: cfg.Now, grace: grace,
		statuses: map[string]*status.Status{}, statusOK: !cfg.StatusUnreadable,
		specHash: func(vm *desired.VM) desired.Hash { return desired.SpecHash(vm.Spec) },
	}
	if cfg.LoadError != "" {
		in.loadErr = errors.New(cfg.LoadError)
	} else {
		fl, err := desired.NewLoader(cfg.Path).Load(memTree(sc.desired))
		if err != nil {
			t.Fatalf("pass %d: desired state: %v", num, err)
		}
		in.fleet = fl
	}
	if !cfg.StatusUnreadable {
		for name, data := range sc.statuses {
			st, err := status.Parse(name, data)
			if err != nil {
				t.Fatalf("pass %d: %v", num, err)
			}
			in.statuses[st.Host] = st
		}
	}
	in.offline = func(host string) (bool, time.Duration) {
		d, ok := cfg.Offline[host]
		return ok, d
	}
	in.attribute = func(refs []ref) (map[ref]snapshots.Tombstone, error) {
		by := snapshots.Tombstone{Commit: desired.Hash(cfg.Head), Author: "author <author@example.com>", Time: cfg.Now.Format(time.RFC3339)}
		if cfg.RemovedBy != nil {
			by = *cfg.RemovedBy
		}
		m := map[ref]snapshots.Tombstone{}
		for _, r := range refs {
			m[r] = by
		}
		return m, nil
	}
	in.rewritten = func() (bool, error) { return cfg.Rewritten, nil }
	in.deletes = DeleteGuard{Max: DefaultMaxDeletes}
	if cfg.MaxDeletes != 0 {
		in.deletes.Max = cfg.MaxDeletes
	}
	in.appliedRange = func() ([]*gitsource.Commit, bool, error) {
		var rng []*gitsource.Commit
		for i, m := range cfg.Messages {
			rng = append(rng, &gitsource.Commit{Hash: fmt.Sprintf("m%d", i), Message: m})
		}
		return rng, false, nil
	}
	if cfg.SignatureError != "" {
		in.verify = func() ([]snapshots.SeenCommit, error) {
			return nil, fmt.Errorf("%w: %s", trust.ErrSignature, cfg.SignatureError)
		}
	}
	read := func(p string) ([]byte, error) {
		data, ok := sc.tip[p]
		if !ok {
			return nil, fmt.Errorf("%s: %w", p, gitsource.ErrFileNotFound)
		}
		return data, nil
	}
	in.readTip = read
	in.lastSnapshot = func(host string) (*snapshots.Snapshot, error) { return readSnapshot(read, host) }
	return in
}

// decisions renders what a pass decided, one line each, in the order the
// steps take them.
func decisions(o *output) []byte {
	var b bytes.Buffer
	if o.rejected != nil {
		fmt.Fprintf(&b, "reject: %v\n", o.rejected)
	}
	for _, h := range o.ignored {
		fmt.Fprintf(&b, "ignore the status of %s\n", h)
	}
	for _, h := range sortedKeys(o.fenceJumps) {
		fmt.Fprintf(&b, "fence jump %s to epoch %d\n", h, o.fenceJumps[h])
	}
	for _, r := range o.unretained {
		fmt.Fprintf(&b, "unretain %s\n", r)
	}
	for _, r := range o.undeleted {
		fmt.Fprintf(&b, "undelete %s\n", r)
	}
	for _, k := range o.retained {
		fmt.Fprintf(&b, "retain %s (history rewritten at %s)\n", k.Ref(), k.Commit)
	}
	for _, tr := range o.tombstoned {
		fmt.Fprintf(&b, "tombstone %s (removed by %s, %s)\n", tr.Ref(), tr.Tombstone.Commit, tr.Tombstone.Author)
	}
	for _, r := range o.finalized {
		fmt.Fprintf(&b, "finalize %s (acked)\n", r)
	}
	for _, s := range o.swept {
		fmt.Fprintf(&b, "sweep %s (%s)\n", ref{Kind: s.Kind, Name: s.Name, Host: s.Host}, s.Reason)
	}
	for _, h := range o.repaired {
		fmt.Fprintf(&b, "repair %s\n", h)
	}
	for _, h := range sortedKeys(o.published) {
		fmt.Fprintf(&b, "publish %s at epoch %d\n", h, o.published[h])
	}
	for _, h := range sortedKeys(o.held) {
		fmt.Fprintf(&b, "hold %s: %s\n", h, o.held[h])
	}
	for _, p := range sortedKeys(o.files) {
		if o.files[p] == nil {
			fmt.Fprintf(&b, "remove %s\n", p)
		}
	}
	if b.Len() == 0 {
		b.WriteString("(nothing)\n")
	}
	return b.Bytes()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// memTree is a desired tree held in memory: path → content.
type memTree map[string][]byte

func (m memTree) Walk(fn func(desired.File) error) error {
	for _, p := range sortedKeys(m) {
		data := m[p]
		f := desired.File{Path: p, Mode: desired.Regular, Size: int64(len(data)),
			Read: func() ([]byte, error) { return data, nil }}
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}
