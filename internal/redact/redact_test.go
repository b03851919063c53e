package redact

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

const secret = "glpat-S3CR3T"

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://" + secret + "@git.example.com/infra/fleet.git", "https://***@git.example.com/infra/fleet.git"},
		{"https://oauth2:" + secret + "@git.example.com/r.git", "https://***@git.example.com/r.git"},
		{"https://git.example.com/r.git?private_token=" + secret, "https://git.example.com/r.git?private_token=***"},
		{"https://x.example/img.qcow2?X-Amz-Signature=" + secret + "&X-Amz-Expires=60", "https://x.example/img.qcow2?X-Amz-Signature=***&X-Amz-Expires=***"},
		{"https://x.example/img?" + secret, "https://x.example/img?***"},
		{"https://x.example/img#" + secret, "https://x.example/img#***"},
		{"ssh://git@git.example.com:22/r.git", "ssh://***@git.example.com:22/r.git"},
		{"https://example.com/r.git", "https://example.com/r.git"},
		{"file:///srv/fleet.git", "file:///srv/fleet.git"},
		{"https://" + secret + "@exa mple.com/%zz", "https://exa mple.com/***"},
		// scp-like remotes keep their host and path: an error must say
		// which repository it is about.
		{"git@github.com:example-org/fleet.git", "***@github.com:example-org/fleet.git"},
		{secret + "@github.com:org/r.git", "***@github.com:org/r.git"},
		{"git:" + secret + "@github.com:org/r.git", "***"},
	} {
		got := URL(tc.in)
		if got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, secret) {
			t.Errorf("URL(%q) keeps the secret: %q", tc.in, got)
		}
	}
}

func TestText(t *testing.T) {
	for _, in := range []string{
		`Get "https://` + secret + `@h.example/a": dial tcp: connection refused`,
		`fetch main from https://u:` + secret + `@h.example/r.git: authentication required`,
		`download http://h.example/i.raw?private_token=` + secret + `, then stop.`,
		"url=https://" + secret + "@h.example/r.git\nnext line",
	} {
		got := Text(in)
		if strings.Contains(got, secret) {
			t.Errorf("Text(%q) = %q keeps the secret", in, got)
		}
		if !strings.Contains(got, "h.example") {
			t.Errorf("Text(%q) = %q lost the host", in, got)
		}
	}
	if got := Text("sha256 mismatch, see https://h.example/a."); got != "sha256 mismatch, see https://h.example/a." {
		t.Errorf("Text changed a clean line: %q", got)
	}
}

func TestLogger(t *testing.T) {
	for _, f := range []logrus.Formatter{&logrus.TextFormatter{DisableColors: true}, &logrus.JSONFormatter{}} {
		var buf bytes.Buffer
		log := logrus.New()
		log.SetOutput(&buf)
		log.SetFormatter(f)
		Logger(log)
		log.WithField("url", "https://"+secret+"@h.example/r.git").
			WithError(&testErr{"Get \"https://h.example/x?token=" + secret + "\": EOF"}).
			Warn("fetch https://u:" + secret + "@h.example/r.git failed")
		if strings.Contains(buf.String(), secret) {
			t.Errorf("%T log line keeps the secret: %s", f, buf.String())
		}
		if !strings.Contains(buf.String(), "h.example") {
			t.Errorf("%T log line lost the host: %s", f, buf.String())
		}
	}
}

type testErr struct{ s string }

func (e *testErr) Error() string { return e.s }
