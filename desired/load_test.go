package desired

import (
	"errors"
	"testing"
)

func TestLoadDirGoodFleet(t *testing.T) {
	f, err := LoadDir(writeTree(t, goodFleet))
	if err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	if len(f.VMs) != 3 || len(f.Volumes) != 1 || len(f.Hosts) != 2 {
		t.Fatalf("got %d VMs, %d volumes, %d hosts; want 3, 1, 2", len(f.VMs), len(f.Volumes), len(f.Hosts))
	}
	web := f.VMs["web-01"]
	if web.Spec.Power != PowerRunning {
		t.Errorf("web-01 power = %q, want the default %q", web.Spec.Power, PowerRunning)
	}
	if web.Origin != (Origin{File: "vms/web-01.yaml", Line: 1, Col: 1}) {
		t.Errorf("web-01 origin = %+v", web.Origin)
	}
	if got := web.Spec.CloudInit.UserData; got != "#cloud-config\npackages: [nginx]\n" {
		t.Errorf("userData = %q", got)
	}
	if f.VMs["web-02"].Spec.Power != PowerStopped {
		t.Errorf("web-02 power = %q", f.VMs["web-02"].Spec.Power)
	}
	if k := f.VMs["kernel-01"].Spec.Kernel; k == nil || k.Initrd == nil || k.Cmdline != "console=ttyS0" {
		t.Errorf("kernel-01 kernel = %+v", k)
	}
	if c := f.Hosts["hv-a"].Spec.Capacity; c == nil || c.VCPUs != 8 || c.MemoryMB != 16384 {
		t.Errorf("hv-a capacity = %+v", c)
	}
}

func TestLoadDirErrorMatchesErrInvalid(t *testing.T) {
	_, err := LoadDir(writeTree(t, withFiles(goodFleet, map[string]string{
		"vms/web-02.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\n",
	})))
	var list ErrorList
	if !errors.As(err, &list) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v; want an ErrorList matching ErrInvalid", err)
	}
}

func TestLoadDirMissingDirectoryIsNotInvalid(t *testing.T) {
	_, err := LoadDir(t.TempDir() + "/absent")
	if err == nil || errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v; want a read error that is not ErrInvalid", err)
	}
}
