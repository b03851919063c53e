package config

import "testing"

// FuzzAgentFile: any input either is refused with an error or decodes into
// a file whose every value resolve accepts (checked as read means checked
// for good); nothing panics.
func FuzzAgentFile(f *testing.F) {
	for _, seed := range []string{
		"repo: {url: /x}\nhost: hv-a\n",
		"artifacts: {fileRoots: [/srv/images/], allowNetworks: [10.1.2.3/16], maxSizeGB: 2, timeout: 5m}\n",
		"qemu: {accel: tcg, systemdScope: false, user: root}\nvmTimeout: 0s\nlogLevel: warn\n",
		"graces:\n  vanish: 1h\n  tombstom: 5m\n",
		"intervals: {tick: soon}\n",
		"- a\n",
		"repo: &r {url: /x}\nhost: *r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var file AgentFile
		if err := decodeStrict("agent.yaml", data, &file, agentFileChecks); err != nil {
			return
		}
		file.Repo.Auth.PasswordFile, file.Repo.Auth.TokenFile = "", "" // no file reads
		if _, err := file.resolve("agent.yaml", mapEnv(nil)); err != nil {
			t.Fatalf("accepted as read, refused as resolved: %v\n%s", err, data)
		}
	})
}
