package fleet

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strings"
)

// DefaultListen is the address the documentation suggests for the
// controller's /metrics and /healthz, and DefaultWebhookListen for its
// webhooks, on a listener of their own (a flood of slow webhook clients
// must not starve the health check): loopback, behind a reverse proxy for
// webhooks. Each listener is off unless an address is given.
const (
	DefaultListen        = "127.0.0.1:9780"
	DefaultWebhookListen = "127.0.0.1:9782"
)

// maxHookBody bounds a webhook request body (bytes): GitHub sends push
// payloads of up to 25 MB. The body is hashed as it streams in, never held
// in memory.
const maxHookBody = 25 << 20

// errHookTooLarge: a body past maxHookBody.
var errHookTooLarge = errors.New("webhook body too large")

// hookCheck checks one forge's proof on a request; body is the request
// body, read at most once. An error is a body that could not be read.
type hookCheck func(r *http.Request, body io.Reader) (bool, error)

// WebhookHandler serves push webhooks that start a pass at once:
//
//	POST /hooks/github  X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>
//	POST /hooks/gitea   X-Gitea-Signature: <hex HMAC-SHA256 of the body>
//	POST /hooks/gitlab  X-Gitlab-Token: <the secret itself>
//
// A request that passes its check calls kick and gets 202 Accepted; the
// payload is never read for content (the pass observes git itself), only
// hashed as it streams, up to maxHookBody (25 MiB; more gets 413). A
// failed check gets 401, another method 405, an unknown path 404. An empty
// secret refuses every request: an open endpoint would let anyone start
// passes.
func WebhookHandler(secret []byte, kick func()) http.Handler {
	mux := http.NewServeMux()
	hmacCheck := func(header, prefix string) hookCheck {
		return func(r *http.Request, body io.Reader) (bool, error) {
			got := strings.TrimSpace(r.Header.Get(header))
			if !strings.HasPrefix(got, prefix) {
				return false, nil
			}
			sig, err := hex.DecodeString(strings.TrimPrefix(got, prefix))
			if err != nil {
				return false, nil
			}
			mac := hmac.New(sha256.New, secret)
			n, err := io.Copy(mac, io.LimitReader(body, maxHookBody+1))
			if err != nil {
				return false, err
			}
			if n > maxHookBody {
				return false, errHookTooLarge
			}
			return hmac.Equal(sig, mac.Sum(nil)), nil
		}
	}
	handle := func(path string, check hookCheck) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				w.Header().Set("Allow", http.MethodPost)
				http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
				return
			}
			if len(secret) == 0 {
				http.Error(w, "signature check failed", http.StatusUnauthorized)
				return
			}
			ok, err := check(r, r.Body)
			switch {
			case errors.Is(err, errHookTooLarge):
				http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
				return
			case err != nil:
				http.Error(w, "body unreadable", http.StatusBadRequest)
				return
			case !ok:
				http.Error(w, "signature check failed", http.StatusUnauthorized)
				return
			}
			kick()
			w.WriteHeader(http.StatusAccepted)
		})
	}
	handle("/hooks/github", hmacCheck("X-Hub-Signature-256", "sha256="))
	handle("/hooks/gitea", hmacCheck("X-Gitea-Signature", ""))
	handle("/hooks/gitlab", func(r *http.Request, _ io.Reader) (bool, error) {
		return subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Gitlab-Token")), secret) == 1, nil
	})
	return mux
}
