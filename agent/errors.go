package agent

import "errors"

// permanentError marks an error that retrying cannot fix until the spec
// changes (a checksum mismatch, an image that is not a disk).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err so that IsPermanent reports true: the engine fails the
// create at once instead of spending its retry budget. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// ErrAddressHeld: the address a VM's network reserves for it is held by
// another machine (another MAC's DHCP lease), so the VM's guest cannot have
// it. A LeaseReporter's Unleased wraps it; the engine names it in the VM's
// lastError at once rather than after ReadyTimeout.
var ErrAddressHeld = errors.New("the guest cannot have it")
