package errchain

import "testing"

func TestRepeat(t *testing.T) {
	for msg, want := range map[string]string{
		"boot: boot: network lan: bridge br0 does not exist":                             "boot",
		"destroy: destroy web-01: remove root.qcow2: permission denied":                  "destroy",
		"boot: qemu exited: exit status 1: qemu-system-x86_64: -kernel x: error loading": "",
		"boot: root disk: stat /v/root.qcow2: no such file or directory":                 "",
		"fetch main: unknown: fetch main: unknown":                                       "fetch main",
		"":                                    "",
		"boot: qemu exited: a: b: x\na: b: x": "",
	} {
		if got := Repeat(msg); got != want {
			t.Errorf("Repeat(%q) = %q; want %q", msg, got, want)
		}
	}
}
