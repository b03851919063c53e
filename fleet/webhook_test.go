package fleet

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func sign(secret, body string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	return hex.EncodeToString(m.Sum(nil))
}

func TestWebhookHandler(t *testing.T) {
	const secret, body = "s3cret", `{"ref":"refs/heads/main"}`
	var kicks atomic.Int32
	srv := httptest.NewServer(WebhookHandler([]byte(secret), func() { kicks.Add(1) }))
	defer srv.Close()
	for _, tc := range []struct {
		name, method, path, header, value string
		want                              int
		kicked                            bool
	}{
		{"github valid", "POST", "/hooks/github", "X-Hub-Signature-256", "sha256=" + sign(secret, body), 202, true},
		{"github wrong secret", "POST", "/hooks/github", "X-Hub-Signature-256", "sha256=" + sign("other", body), 401, false},
		{"github no prefix", "POST", "/hooks/github", "X-Hub-Signature-256", sign(secret, body), 401, false},
		{"github missing", "POST", "/hooks/github", "", "", 401, false},
		{"gitea valid", "POST", "/hooks/gitea", "X-Gitea-Signature", sign(secret, body), 202, true},
		{"gitea body tampered", "POST", "/hooks/gitea", "X-Gitea-Signature", sign(secret, body+" "), 401, false},
		{"gitea not hex", "POST", "/hooks/gitea", "X-Gitea-Signature", "zz", 401, false},
		{"gitlab valid", "POST", "/hooks/gitlab", "X-Gitlab-Token", secret, 202, true},
		{"gitlab wrong", "POST", "/hooks/gitlab", "X-Gitlab-Token", secret + "x", 401, false},
		{"gitlab signature is not a token", "POST", "/hooks/gitlab", "X-Hub-Signature-256", "sha256=" + sign(secret, body), 401, false},
		{"get refused", "GET", "/hooks/github", "X-Hub-Signature-256", "sha256=" + sign(secret, body), 405, false},
		{"unknown forge", "POST", "/hooks/bitbucket", "X-Hub-Signature-256", "sha256=" + sign(secret, body), 404, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := kicks.Load()
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.header != "" {
				req.Header.Set(tc.header, tc.value)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("status = %d, want %d", resp.StatusCode, tc.want)
			}
			if kicked := kicks.Load() > before; kicked != tc.kicked {
				t.Errorf("kicked = %v, want %v", kicked, tc.kicked)
			}
		})
	}
}

func TestWebhookEmptySecretRefusesAll(t *testing.T) {
	h := WebhookHandler(nil, func() { t.Error("kicked without a secret") })
	for _, hdr := range [][2]string{{"X-Gitlab-Token", ""}, {"X-Hub-Signature-256", "sha256=" + sign("", "x")}} {
		req := httptest.NewRequest("POST", "/hooks/gitlab", strings.NewReader("x"))
		if hdr[0] == "X-Hub-Signature-256" {
			req = httptest.NewRequest("POST", "/hooks/github", strings.NewReader("x"))
		}
		req.Header.Set(hdr[0], hdr[1])
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", hdr[0], rec.Code)
		}
	}
}

// GitHub sends push payloads up to 25 MB: such a body is hashed as it
// streams and accepted; a body past 25 MiB gets 413.
func TestWebhookLargeBodies(t *testing.T) {
	const secret = "s3cret"
	var kicks atomic.Int32
	srv := httptest.NewServer(WebhookHandler([]byte(secret), func() { kicks.Add(1) }))
	defer srv.Close()
	for _, tc := range []struct {
		name string
		size int
		want int
	}{
		{"24 MiB push", 24 << 20, http.StatusAccepted},
		{"exactly 25 MiB", 25 << 20, http.StatusAccepted},
		{"past 25 MiB", 25<<20 + 1, http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := strings.Repeat("x", tc.size)
			req, err := http.NewRequest("POST", srv.URL+"/hooks/github", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Hub-Signature-256", "sha256="+sign(secret, body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("status = %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
	if kicks.Load() != 2 {
		t.Errorf("kicks = %d, want 2", kicks.Load())
	}
}
