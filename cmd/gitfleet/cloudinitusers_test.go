package main

import (
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// validate warns of SSH keys that would land on root: the VM's
// #cloud-config users list lacks "default".
func TestValidateWarnsOfKeysOnNoUser(t *testing.T) {
	vm := testVM("a", "1") + "  cloudInit:\n    sshAuthorizedKeys: [\"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGRLEdvtTk0H1fhdbY0YvJ4wGIDsG1Xeeu8YK3MDpMnW ops@example.org\"]\n" +
		"    userData: |\n      #cloud-config\n      users:\n        - name: ops\n"
	dir := writeFleet(t, map[string]string{"h.yaml": testHost, "vms/a.yaml": vm})
	code, out := runCLI(t, "validate", dir)
	want := "warning: " + dir + "/vms/a.yaml:12:15: vm a: spec.cloudInit.userData's users: list lacks \"default\""
	if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "land on root") {
		t.Errorf("exit %d, output %q, want it to contain %q", code, out, want)
	}
}

// Plan warns of the same keys, at the head's file, so a review sees it
// before the merge.
func TestPlanWarnsOfKeysOnNoUser(t *testing.T) {
	dir := cliFleet(t)
	base := gittest.Rev(t, dir, "refs/heads/main")
	gittest.SetBranch(t, dir, "keys", base)
	vm := cliVM("web-01", "hv-a", "1") + "  cloudInit:\n    sshAuthorizedKeys: [\"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGRLEdvtTk0H1fhdbY0YvJ4wGIDsG1Xeeu8YK3MDpMnW ops@example.org\"]\n" +
		"    userData: |\n      #cloud-config\n      users:\n        - name: ops\n"
	gittest.Commit(t, dir, gittest.Edit{Branch: "keys", Write: map[string]string{"fleet/web-01.yaml": vm}})
	code, out := runCLI(t, "plan", "--repo", dir, "--path", "fleet", "--base", "main", "--head", "keys")
	if code != 0 || !strings.Contains(out, "fleet/web-01.yaml:") || !strings.Contains(out, "lacks \"default\"") || !strings.Contains(out, "land on root") {
		t.Errorf("exit %d, plan does not warn of keys on no user:\n%s", code, out)
	}
}
