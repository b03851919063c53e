package agent

import (
	"context"

	"github.com/gitfleet/gitfleet/agent/backup"
)

// SetRemoveHook makes every removal of s.RemoveVM call hook first and fail
// with its error, if any: the seam tests use to fail a removal half-way.
func SetRemoveHook(s *Store, hook func(path string) error) { s.removeHook = hook }

// Retain is the engine's retention of vm's backups in repo (backups.go).
func Retain(e *Engine, repo *backup.Repository, vm string, policy backup.KeepPolicy) error {
	return e.retain(context.Background(), repo, vm, policy)
}
