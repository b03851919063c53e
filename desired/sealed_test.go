package desired

import (
	"errors"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/internal/sealed"
)

// sealedFleet is a host hv-a with an age recipient and a VM whose
// user-data is encrypted to it; hostExtra and vmExtra are appended to the
// Host's spec and the VM's cloudInit.
func sealedFleet(t *testing.T, hostRecipient, vmRecipient, ciphertext string) map[string]string {
	t.Helper()
	return map[string]string{
		"hosts/hv-a.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec:\n  ageRecipient: " + hostRecipient + "\n",
		"hosts/hv-b.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-b}\nspec: {}\n",
		"vms/web-01.yaml": `apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata: {name: web-01}
spec:
  host: hv-a
  vcpus: 1
  memoryMB: 512
  diskGB: 1
  image: {url: "https://example.org/a.qcow2", sha256: ` + sumA + `}
  cloudInit:
    encryptedUserData:
      recipient: ` + vmRecipient + `
      ciphertext: |
` + indent(ciphertext, "        "),
	}
}

func indent(s, pad string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(strings.TrimRight(s, "\n")+"\n", "\n") {
		if l != "" {
			b.WriteString(pad + l)
		}
	}
	return b.String()
}

func newRecipient(t *testing.T) string {
	t.Helper()
	_, r, err := sealed.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func seal(t *testing.T, recipient, plain string) string {
	t.Helper()
	ct, err := sealed.Seal(recipient, "web-01", []byte(plain))
	if err != nil {
		t.Fatal(err)
	}
	return ct
}

const secretUserData = "#cloud-config\nchpasswd: {list: 'root:S3cr3t-hunter2'}\n"

func TestEncryptedUserDataLoads(t *testing.T) {
	r := newRecipient(t)
	ct := seal(t, r, secretUserData)
	f, err := LoadDir(writeTree(t, sealedFleet(t, r, r, ct)))
	if err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	e := f.VMs["web-01"].Spec.CloudInit.EncryptedUserData
	if e == nil || e.Recipient != r || e.Ciphertext != ct {
		t.Fatalf("encryptedUserData = %+v", e)
	}
	if f.Hosts["hv-a"].Spec.AgeRecipient != r {
		t.Errorf("ageRecipient = %q", f.Hosts["hv-a"].Spec.AgeRecipient)
	}
}

// Every way encrypted user-data or a Host's recipient can be wrong is an
// error at its FILE:LINE:COL, and none quotes a secret.
func TestEncryptedUserDataValidation(t *testing.T) {
	r, other := newRecipient(t), newRecipient(t)
	ct := seal(t, r, secretUserData)
	base := sealedFleet(t, r, r, ct)
	vm := base["vms/web-01.yaml"]
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string // FILE:LINE:COL: FIELD: message fragments, one per error
	}{
		{
			name:  "malformed Host recipient",
			files: withFiles(base, map[string]string{"hosts/hv-a.yaml": strings.Replace(base["hosts/hv-a.yaml"], r, "age1-not-a-key", 1)}),
			want:  []string{"hosts/hv-a.yaml:5:17: spec.ageRecipient: \"age1-not-a-k\"… is not an age recipient"},
		},
		{
			name:  "a secret key as the Host recipient",
			files: withFiles(base, map[string]string{"hosts/hv-a.yaml": strings.Replace(base["hosts/hv-a.yaml"], r, "AGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ", 1)}),
			want:  []string{"hosts/hv-a.yaml:5:17: spec.ageRecipient: is an age secret key, not a recipient"},
		},
		{
			name:  "malformed VM recipient",
			files: withFiles(base, map[string]string{"vms/web-01.yaml": strings.Replace(vm, "recipient: "+r, "recipient: ssh-rsa AAAA", 1)}),
			want:  []string{"vms/web-01.yaml:12:18: spec.cloudInit.encryptedUserData.recipient: \"ssh-rsa AAAA\"… is not an age recipient"},
		},
		{
			name:  "encrypted to a key the Host no longer names",
			files: withFiles(base, map[string]string{"hosts/hv-a.yaml": strings.Replace(base["hosts/hv-a.yaml"], r, other, 1)}),
			want:  []string{"vms/web-01.yaml:12:18: spec.cloudInit.encryptedUserData.recipient: the user-data is encrypted to " + r + ", but Host \"hv-a\"'s spec.ageRecipient is " + other + " (hosts/hv-a.yaml:5:17): the host's key changed or the VM moved"},
		},
		{
			name:  "moved to a host without a recipient",
			files: withFiles(base, map[string]string{"vms/web-01.yaml": strings.Replace(vm, "host: hv-a", "host: hv-b", 1)}),
			want:  []string{"vms/web-01.yaml:12:18: spec.cloudInit.encryptedUserData.recipient: the user-data is encrypted to " + r + ", but Host \"hv-b\" names no spec.ageRecipient"},
		},
		{
			name:  "not an age file",
			files: sealedFleet(t, r, r, "#cloud-config\npassword: S3cr3t-hunter2\n"),
			want:  []string{"vms/web-01.yaml:13:19: spec.cloudInit.encryptedUserData.ciphertext: is not an ASCII-armored age file"},
		},
		{
			name:  "both userData and encryptedUserData",
			files: withFiles(base, map[string]string{"vms/web-01.yaml": strings.Replace(vm, "  cloudInit:\n", "  cloudInit:\n    userData: \"#cloud-config\\n\"\n", 1)}),
			want:  []string{"vms/web-01.yaml:12:5: spec.cloudInit.encryptedUserData: spec.cloudInit has both userData and encryptedUserData"},
		},
		{
			name:  "no recipient",
			files: withFiles(base, map[string]string{"vms/web-01.yaml": strings.Replace(vm, "      recipient: "+r+"\n", "", 1)}),
			want:  []string{"vms/web-01.yaml:11:5: spec.cloudInit.encryptedUserData.recipient: missing"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadDir(writeTree(t, tc.files))
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("err = %v; want an ErrorList", err)
			}
			if len(list) != len(tc.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(list), len(tc.want), err)
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(list[i].Error(), w) {
					t.Errorf("error %d:\n got %s\nwant %s…", i, list[i], w)
				}
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "QQQQQQQQ") {
				t.Errorf("an error quotes a secret: %v", err)
			}
		})
	}
}

// The spec hash covers the ciphertext: a new secret, even of the same
// length to the same key, is a new spec (a cloudInit change).
func TestSpecHashFollowsCiphertext(t *testing.T) {
	r := newRecipient(t)
	spec := func(ct string) VMSpec {
		return VMSpec{Host: "hv-a", VCPUs: 1, CloudInit: &CloudInit{EncryptedUserData: &EncryptedUserData{Recipient: r, Ciphertext: ct}}}
	}
	a, b := seal(t, r, secretUserData), seal(t, r, secretUserData)
	if SpecHash(spec(a)) == SpecHash(spec(b)) {
		t.Error("two encryptions of the same user-data hash alike; a re-encryption would go unseen")
	}
	if SpecHash(spec(a)) != SpecHash(spec(a)) {
		t.Error("the hash is not stable")
	}
}

// plan shows an encrypted user-data change as a secret change, warns on
// a Host's new recipient, and never shows plaintext or ciphertext.
func TestPlanOfEncryptedUserData(t *testing.T) {
	r, r2 := newRecipient(t), newRecipient(t)
	base, err := LoadDir(writeTree(t, sealedFleet(t, r, r, seal(t, r, secretUserData))))
	if err != nil {
		t.Fatal(err)
	}
	ct2 := seal(t, r2, secretUserData+"# rotated\n")
	head, err := LoadDir(writeTree(t, sealedFleet(t, r2, r2, ct2)))
	if err != nil {
		t.Fatal(err)
	}
	p := ComputePlan(base, head, PlanOptions{})
	text := p.Text()
	for _, want := range []string{AgeRecipientWarning, CloudInitEditWarning, "(secret, changed)"} {
		if !strings.Contains(text, want) {
			t.Errorf("plan lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "BEGIN AGE") || strings.Contains(text, "hunter2") || strings.Contains(text, ct2[40:80]) {
		t.Errorf("plan shows user-data:\n%s", text)
	}
}

func TestSetEncryptedUserData(t *testing.T) {
	enc := EncryptedUserData{Recipient: "age1example", Ciphertext: sealed.ArmorHeader + "\nQUJD\n-----END AGE ENCRYPTED FILE-----\n"}
	head := "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: web-01}\nspec:\n  host: hv-a\n  vcpus: 1\n"
	block := func(pad string) string {
		return pad + "encryptedUserData:\n" + pad + "  recipient: age1example\n" + pad + "  ciphertext: |\n" +
			pad + "    " + sealed.ArmorHeader + "\n" + pad + "    QUJD\n" + pad + "    -----END AGE ENCRYPTED FILE-----\n"
	}
	for _, tc := range []struct{ name, in, want, err string }{
		{
			name: "literal userData in the middle, comments and blank lines kept",
			in:   head + "  cloudInit:\n    sshAuthorizedKeys: [k]  # key\n    userData: |\n      #cloud-config\n      password: x\n\n    # about power\n  power: running\n",
			want: head + "  cloudInit:\n    sshAuthorizedKeys: [k]  # key\n" + block("    ") + "\n    # about power\n  power: running\n",
		},
		{
			name: "quoted userData last in the file, no final line break",
			in:   head + "  cloudInit:\n    userData: \"#cloud-config\\npassword: x\\n\"",
			want: head + "  cloudInit:\n" + block("    "),
		},
		{
			name: "an earlier encryptedUserData is replaced",
			in:   head + "  cloudInit:\n    encryptedUserData:\n      recipient: age1old\n      ciphertext: |\n        old\n  memoryMB: 64\n",
			want: head + "  cloudInit:\n" + block("    ") + "  memoryMB: 64\n",
		},
		{
			name: "no cloudInit: made as spec's first field",
			in:   head,
			want: "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: web-01}\nspec:\n  cloudInit:\n" + block("    ") + "  host: hv-a\n  vcpus: 1\n",
		},
		{
			name: "cloudInit without user-data",
			in:   head + "  cloudInit:\n    sshAuthorizedKeys: [k]\n",
			want: head + "  cloudInit:\n" + block("    ") + "    sshAuthorizedKeys: [k]\n",
		},
		{
			name: "flow-style cloudInit is refused",
			in:   head + "  cloudInit: {userData: \"#cloud-config\\n\"}\n",
			err:  "spec.cloudInit must be a block mapping",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SetEncryptedUserData("vm.yaml", []byte(tc.in), enc)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestFindHostRecipient(t *testing.T) {
	r := newRecipient(t)
	dir := writeTree(t, withFiles(sealedFleet(t, r, r, "x"), map[string]string{".old/hv-a.yaml": "kind: Host\nmetadata: {name: hv-a}\nspec: {ageRecipient: age1hidden}\n"}))
	got, file, err := FindHostRecipient(DirTree(dir), "hv-a")
	if err != nil || got != r || file != "hosts/hv-a.yaml" {
		t.Errorf("hv-a: %q %q %v", got, file, err)
	}
	for host, want := range map[string]string{"hv-b": "names no spec.ageRecipient", "hv-z": "no Host \"hv-z\" found"} {
		if _, _, err := FindHostRecipient(DirTree(dir), host); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", host, err, want)
		}
	}
	twice := writeTree(t, withFiles(sealedFleet(t, r, r, "x"), map[string]string{"more/hv-a.yaml": "kind: Host\nmetadata: {name: hv-a}\nspec: {ageRecipient: " + r + "}\n"}))
	if _, _, err := FindHostRecipient(DirTree(twice), "hv-a"); err == nil || !strings.Contains(err.Error(), `Host "hv-a" is defined 2 times`) {
		t.Errorf("a Host defined twice: %v", err)
	}
}
