package backup

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckURL(t *testing.T) {
	for _, tc := range []struct {
		url    string
		ok     bool
		secret string // must not appear in the error
	}{
		{"/srv/restic", true, ""},
		{"local:/srv/restic", true, ""},
		{"sftp:backup@nas.example:/srv/restic", true, ""},
		{"sftp://backup@nas.example:2222//srv/restic", true, ""},
		{"sftp:[2001:db8::1]:/srv/restic", true, ""},
		{"rest:https://backup.example:8000/hv-a/", true, ""},
		{"s3:https://s3.example/bucket/gitfleet", true, ""},
		{"s3:s3.amazonaws.com/bucket", true, ""},
		{"b2:bucket:gitfleet", true, ""},
		{"rest:https://user:hunter2secret@backup.example/", false, "hunter2secret"},
		{"rest:https://token@backup.example/", false, "token"},
		{"sftp://user:hunter2secret@nas.example//srv", false, "hunter2secret"},
		{"sftp:user:hunter2secret@nas.example:/srv", false, "hunter2secret"},
		{"s3:https://key:hunter2secret@s3.example/bucket", false, "hunter2secret"},
		{"rest:https://backup.example/?token=hunter2secret", false, "hunter2secret"},
		{"relative/path", false, ""},
		{"-o sftp.command=evil", false, ""},
		{"/srv/restic repo", false, ""},
		{"ftp:host:/x", false, ""},
		{"", false, ""},
	} {
		err := CheckURL(tc.url)
		if (err == nil) != tc.ok {
			t.Errorf("CheckURL(%q) = %v, want ok %v", tc.url, err, tc.ok)
			continue
		}
		if err != nil && !errors.Is(err, ErrConfig) {
			t.Errorf("CheckURL(%q) = %v, want ErrConfig", tc.url, err)
		}
		if err != nil && tc.secret != "" && strings.Contains(err.Error(), tc.secret) {
			t.Errorf("CheckURL(%q) quotes the secret: %v", tc.url, err)
		}
	}
	loc, err := ParseURL("sftp://backup@nas.example:2222//srv/restic")
	if err != nil || loc != (Location{Backend: BackendSFTP, User: "backup", Host: "nas.example", Port: "2222", Path: "/srv/restic"}) {
		t.Errorf("ParseURL = %+v, %v", loc, err)
	}
}

func TestEnvironmentFileNamesFileLineAndKey(t *testing.T) {
	dir := t.TempDir()
	good := writeSecret(t, dir, "good.env", "# creds\nexport AWS_ACCESS_KEY_ID=AKIA\nAWS_SECRET_ACCESS_KEY='s3cr3t value'\n\nRESTIC_REST_PASSWORD=\"p\"\n")
	env, values, err := readEnvironmentFile(good)
	if err != nil || strings.Join(env, ";") != "AWS_ACCESS_KEY_ID=AKIA;AWS_SECRET_ACCESS_KEY=s3cr3t value;RESTIC_REST_PASSWORD=p" || len(values) != 3 {
		t.Fatalf("env %q values %q err %v", env, values, err)
	}
	bad := writeSecret(t, dir, "bad.env", "AWS_ACCESS_KEY_ID=AKIA\nRESTIC_PASSWORD=x\n")
	if _, _, err := readEnvironmentFile(bad); err == nil || !strings.Contains(err.Error(), "bad.env line 2") || !strings.Contains(err.Error(), "RESTIC_PASSWORD") {
		t.Errorf("a key restic is not to get from the file: %v", err)
	}
}

func TestRedactRemovesSecretsAndUserInfo(t *testing.T) {
	s := &session{secrets: []string{"hunter2secret", "AKIAEXAMPLE"}}
	got := s.redact(`Fatal: Head "https://u:hunter2secret@h/config": 401; key AKIAEXAMPLE`)
	if strings.Contains(got, "hunter2secret") || strings.Contains(got, "AKIAEXAMPLE") {
		t.Errorf("redact left a secret: %s", got)
	}
}
