package main

import "testing"

// Exit codes are part of the command line's contract: scripts and CI tell a
// rejected input (1) from a command used wrongly (2).
func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"version", []string{"version"}, 0},
		{"mistyped subcommand", []string{"valdate"}, 2},
		{"unknown flag", []string{"version", "--nope"}, 2},
		{"too many arguments", []string{"validate", "a", "b"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, _ := runCLI(t, tc.args...); code != tc.want {
				t.Errorf("gitfleet %v: exit %d, want %d", tc.args, code, tc.want)
			}
		})
	}
}
