package secretfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const secret = "SECRET-KEY-MATERIAL"
	good := write("good", secret, 0o600)
	readOnly := write("readonly", secret, 0o400)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{good, readOnly} {
		data, err := Read(p, "test key", "others can read it", 64)
		if err != nil || string(data) != secret {
			t.Errorf("Read(%s) = %q, %v; want the file's contents", p, data, err)
		}
	}
	for _, tc := range []struct{ name, path, want string }{
		{"group may read", write("group", secret, 0o640), "test key " + dir + "/group has mode 0640: others can read it; chmod 600"},
		{"others may write", write("world", secret, 0o602), "mode 0602"},
		{"a symbolic link", link, "is a symbolic link"},
		{"a directory", dir, "not a regular file"},
		{"too long", write("long", strings.Repeat("x", 65), 0o600), "larger than 64 bytes"},
		{"missing", filepath.Join(dir, "absent"), "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(tc.path, "test key", "others can read it", 64)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Read(%s) = %v, want an error containing %q", tc.path, err, tc.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error quotes the file: %v", err)
			}
		})
	}
}
