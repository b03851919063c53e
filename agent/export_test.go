package agent

// SetRemoveHook makes every removal of s.RemoveVM call hook first and fail
// with its error, if any: the seam tests use to fail a removal half-way.
func SetRemoveHook(s *Store, hook func(path string) error) { s.removeHook = hook }
