package agent_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/backup"
)

// TestRetentionKeepsWholeBackups: retention applies the keep policy to
// whole backups (their manifests), and forgets the disks of the backups
// it forgets and the disk a killed run left without a manifest, even
// when that leftover is newer than every whole backup; the disks of a
// kept backup stay, and so does another host's backup of the same VM.
func TestRetentionKeepsWholeBackups(t *testing.T) {
	if _, err := exec.LookPath("restic"); err != nil {
		t.Skip("restic not installed")
	}
	ctx := context.Background()
	dir := t.TempDir()
	pw := filepath.Join(dir, "password")
	require.NoError(t, os.WriteFile(pw, []byte("retention test\n"), 0o600))
	repo := &backup.Repository{URL: filepath.Join(dir, "repo"), PasswordFile: pw, CacheDir: filepath.Join(dir, "cache")}
	require.NoError(t, repo.Init(ctx))
	store := func(host, file string, tags []string, data []byte) string {
		res, err := repo.Backup(ctx, bytes.NewReader(data), backup.BackupRequest{Filename: file, Host: host, Tags: tags, Size: int64(len(data))})
		require.NoError(t, err)
		return res.SnapshotID
	}
	whole := func(host, id string) (disk, meta string) {
		data := []byte("disk of " + id)
		disk = store(host, backup.DiskFilename("db-01", "root"), backup.DiskTags("db-01", "root", id), data)
		sum := sha256.Sum256(data)
		m, err := json.Marshal(backup.Manifest{Format: backup.ManifestFormat, BackupID: id, VM: "db-01", Host: host, Consistency: backup.ConsistencyCrash,
			Disks: []backup.ManifestDisk{{Name: "root", VirtualSize: int64(len(data)), SnapshotID: disk, File: backup.DiskFilename("db-01", "root"), SHA256: hex.EncodeToString(sum[:])}}})
		require.NoError(t, err)
		return disk, store(host, backup.ManifestFilename("db-01"), backup.MetaTags("db-01", id), m)
	}
	oldDisk, oldMeta := whole(testHost, "b1")
	keptDisk, keptMeta := whole(testHost, "b2")
	leftover := store(testHost, backup.DiskFilename("db-01", "root"), backup.DiskTags("db-01", "root", "b3"), []byte("a killed run"))
	otherDisk, otherMeta := whole("hv-b", "b4")

	f := newFixture(t)
	require.NoError(t, agent.Retain(f.eng, repo, "db-01", backup.KeepPolicy{Last: 1}))
	all, err := repo.Snapshots(ctx, backup.Filter{Tags: []string{backup.TagOwner}})
	require.NoError(t, err)
	var ids []string
	for _, s := range all {
		ids = append(ids, s.ID)
	}
	assert.ElementsMatch(t, []string{keptDisk, keptMeta, otherDisk, otherMeta}, ids,
		"kept: b2 whole and hv-b's backup; forgotten: b1 (%s, %s) and the leftover %s", oldDisk, oldMeta, leftover)
}
