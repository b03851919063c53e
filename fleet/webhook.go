package fleet

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
)

// maxHookBody bounds a webhook request body (bytes); forges send far less.
const maxHookBody = 1 << 20

// WebhookHandler serves push webhooks that start a pass at once:
//
//	POST /hooks/github  X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>
//	POST /hooks/gitea   X-Gitea-Signature: <hex HMAC-SHA256 of the body>
//	POST /hooks/gitlab  X-Gitlab-Token: <the secret itself>
//
// A request that passes its check calls kick and gets 202 Accepted; the
// payload is never read for content (the pass observes git itself). A
// failed check gets 401, another method 405, an unknown path 404. An empty
// secret refuses every request: an open endpoint would let anyone start
// passes.
func WebhookHandler(secret []byte, kick func()) http.Handler {
	mux := http.NewServeMux()
	hmacCheck := func(header, prefix string) func(*http.Request, []byte) bool {
		return func(r *http.Request, body []byte) bool {
			got := strings.TrimSpace(r.Header.Get(header))
			if !strings.HasPrefix(got, prefix) {
				return false
			}
			sig, err := hex.DecodeString(strings.TrimPrefix(got, prefix))
			if err != nil {
				return false
			}
			mac := hmac.New(sha256.New, secret)
			mac.Write(body)
			return hmac.Equal(sig, mac.Sum(nil))
		}
	}
	handle := func(path string, check func(*http.Request, []byte) bool) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				w.Header().Set("Allow", http.MethodPost)
				http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
				return
			}
			body, err := io.ReadAll(io.LimitReader(r.Body, maxHookBody+1))
			if err != nil || len(body) > maxHookBody {
				http.Error(w, "body unreadable or too large", http.StatusBadRequest)
				return
			}
			if len(secret) == 0 || !check(r, body) {
				http.Error(w, "signature check failed", http.StatusUnauthorized)
				return
			}
			kick()
			w.WriteHeader(http.StatusAccepted)
		})
	}
	handle("/hooks/github", hmacCheck("X-Hub-Signature-256", "sha256="))
	handle("/hooks/gitea", hmacCheck("X-Gitea-Signature", ""))
	handle("/hooks/gitlab", func(r *http.Request, _ []byte) bool {
		return subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Gitlab-Token")), secret) == 1
	})
	return mux
}
