package gitsource

import (
	"context"
	"strings"
	"sync"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"
)

// One ref advertisement shared by the fetches of a pass. Protocol v0 has
// every upload-pack session (a git-upload-pack process, or an http
// GET …/info/refs and POST …/git-upload-pack) list every ref of the remote
// first; a fetch that finds its refs up to date has still cost one. A
// caller that fetches from one remote into two caches (the controller's
// desired branch cache and its tip cache) records the advertisement the
// first fetch read, and the second fetch skips its own session when the
// advertised tips of every ref it asks for are the ones its cache already
// tracks: what a fetch at the moment of the first advertisement would
// have found.

// Advertisement is the remote's branches as one upload-pack session's ref
// advertisement listed them, shared by the fetches of one pass: the fetches
// run under a context from WithAdvertisement(ctx, adv) record it and use it.
// The zero value holds none. The fetches sharing one run one after another
// (the advertisement kept is the last a successful fetch read). A caller shares one
// only between Repos of the same remote opened with the same credentials
// (a git host may advertise different refs to different credentials), and
// only for as long as it would accept tips that old (a pass: the next pass
// starts from a new one).
type Advertisement struct {
	mu sync.Mutex
	// url is the normalized remote URL of the fetch that recorded
	// branches ("" before one did); branches is branch → tip.
	url      string
	branches map[string]string
	// pending is what the current session read, before its fetch
	// succeeded and names the remote.
	pending map[string]string
}

type advertisementKey struct{}

// WithAdvertisement returns ctx carrying adv: a Fetch, FetchAll or
// FetchPrefix under it records in adv the ref advertisement its upload-pack
// session read, and skips its session when adv already holds one of the
// same remote whose tips of the asked refs are the tracked ones (see
// Advertisement).
func WithAdvertisement(ctx context.Context, adv *Advertisement) context.Context {
	return context.WithValue(ctx, advertisementKey{}, adv)
}

func advertisementOf(ctx context.Context) *Advertisement {
	adv, _ := ctx.Value(advertisementKey{}).(*Advertisement)
	return adv
}

// read records the branches of one advertisement as pending.
func (a *Advertisement) read(ar *packp.AdvRefs) {
	refs, err := ar.AllReferences()
	if err != nil {
		return
	}
	branches := make(map[string]string, len(refs))
	for name, ref := range refs {
		if b, ok := strings.CutPrefix(name.String(), "refs/heads/"); ok && ref.Type() == plumbing.HashReference {
			branches[b] = ref.Hash().String()
		}
	}
	a.mu.Lock()
	a.pending = branches
	a.mu.Unlock()
}

// settle makes the pending advertisement the recorded one of url after a
// fetch that read it succeeded; after a failed fetch it is dropped.
func (a *Advertisement) settle(url string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ok && a.pending != nil {
		a.url, a.branches = url, a.pending
	}
	a.pending = nil
}

// tips is the recorded advertisement of url (nil when there is none, or
// a is nil).
func (a *Advertisement) tips(url string) map[string]string {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.url != url {
		return nil
	}
	return a.branches
}

// unchanged reports whether the advertised tips of set (its branches, and
// every branch under its prefixes) are exactly the tips the cache tracks:
// the same branches, at the same commits. Caller holds r.mu.
func (r *Repo) unchanged(adv map[string]string, set refSet) bool {
	if adv == nil || len(r.missing) > 0 {
		return false
	}
	tracked, err := r.trackedTips(refSet{prefixes: set.prefixes})
	if err != nil {
		return false
	}
	for _, b := range set.branches {
		tip, advertised := adv[b]
		ref, err := r.st.Reference(trackingRef(b))
		switch {
		case err != nil && !advertised:
			// Neither here nor there: left out of the answer either way.
		case err != nil || !advertised || ref.Hash().String() != tip:
			return false
		}
	}
	under := 0
	for b, tip := range adv {
		for _, p := range set.prefixes {
			if strings.HasPrefix(b, p) {
				under++
				if tracked[b] != tip {
					return false
				}
				break
			}
		}
	}
	return under == len(tracked)
}

// recordingTransport is a transport whose upload-pack sessions record
// their ref advertisement in the Advertisement of the context they read it
// under.
type recordingTransport struct{ transport.Transport }

func (t recordingTransport) NewUploadPackSession(ep *transport.Endpoint, auth transport.AuthMethod) (transport.UploadPackSession, error) {
	s, err := t.Transport.NewUploadPackSession(ep, auth)
	if err != nil {
		return nil, err
	}
	return recordingSession{s}, nil
}

type recordingSession struct{ transport.UploadPackSession }

func (s recordingSession) AdvertisedReferencesContext(ctx context.Context) (*packp.AdvRefs, error) {
	ar, err := s.UploadPackSession.AdvertisedReferencesContext(ctx)
	if adv := advertisementOf(ctx); err == nil && adv != nil {
		adv.read(ar)
	}
	return ar, err
}

// recordAdvertisements installs t for scheme, its upload-pack sessions
// recording their advertisement (see Advertisement).
func recordAdvertisements(scheme string, t transport.Transport) {
	client.InstallProtocol(scheme, recordingTransport{t})
}

func init() {
	// ssh is go-git's own client; file, http and https are installed,
	// recording, where gitsource builds them (filetransport.go,
	// advertisement.go).
	if t, ok := client.Protocols["ssh"]; ok {
		recordAdvertisements("ssh", t)
	}
}

// fetchAdvertised is fetchRefs's answer without a session when adv holds
// an advertisement of this remote in which set is unchanged: the tracked
// tips, each verified present. ok is false when a fetch is needed.
func (r *Repo) fetchAdvertised(adv *Advertisement, set refSet) (tips map[string]string, ok bool) {
	if adv == nil {
		return nil, false
	}
	advertised := adv.tips(r.url)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.unchanged(advertised, set) {
		return nil, false
	}
	tips, err := r.trackedTips(set.advertisedIn(advertised))
	if err != nil {
		return nil, false
	}
	for _, tip := range tips {
		if r.verifyCommit(plumbing.NewHash(tip)) != nil {
			return nil, false // damage: the fetch repairs it
		}
	}
	return tips, true
}

// advertisedIn is set without the exact branches advertised (branch →
// tip) does not list; its prefixes stay.
func (s refSet) advertisedIn(advertised map[string]string) refSet {
	present := refSet{prefixes: s.prefixes}
	for _, b := range s.branches {
		if _, ok := advertised[b]; ok {
			present.branches = append(present.branches, b)
		}
	}
	return present
}
