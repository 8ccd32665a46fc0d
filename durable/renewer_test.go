package durable

import (
	"context"
	"errors"
	"testing"
)

// stubRenewer answers every renewal with names and err.
type stubRenewer struct {
	names []string
	err   error
}

func (s stubRenewer) RenewLease(context.Context, string, []byte, string, []byte) ([]string, error) {
	return s.names, s.err
}

// TestRenewAtOnce: what a storage that renews in one call answers is
// read as the renewal in several calls reads it: a lease gone, a
// journal gone, another value, a higher epoch or another owner of the
// same epoch in the folder are a lost lease; a failed call leaves it
// unproven; a value the storage cannot compare goes the generic way.
func TestRenewAtOnce(t *testing.T) {
	key := leaseKeyOf("s", 1, Owner())
	mine := []string{"seg.00000000", "lease", key[len(journalDir("s"))+1:]}
	for _, tc := range []struct {
		name     string
		prev     []byte
		answer   stubRenewer
		lost     bool
		takenBy  bool
		unproven bool
	}{
		{"renewed", []byte("x"), stubRenewer{names: mine}, false, false, false},
		{"lease gone", []byte("x"), stubRenewer{err: ErrKeyGone}, true, false, false},
		{"journal gone", nil, stubRenewer{err: ErrKeyGone}, true, false, false},
		{"another value", []byte("x"), stubRenewer{err: ErrKeyChanged}, true, true, false},
		{"a higher epoch", []byte("x"), stubRenewer{names: append(mine, "lease.00000002.abcdef")}, true, true, false},
		{"another owner of the epoch", []byte("x"), stubRenewer{names: append(mine, "lease.00000001.abcdef")}, true, true, false},
		{"the call failed", []byte("x"), stubRenewer{err: errors.New("timeout")}, false, false, true},
	} {
		err := renewAtOnce(context.Background(), tc.answer, "s", 1, key, tc.prev, []byte("y"))
		var lost *lostLease
		switch {
		case tc.lost != errors.As(err, &lost):
			t.Errorf("%s: %v, lost %v", tc.name, err, tc.lost)
		case tc.lost && lost.takenOver != tc.takenBy:
			t.Errorf("%s: taken over %v, want %v", tc.name, lost.takenOver, tc.takenBy)
		case tc.unproven != (err != nil && !tc.lost):
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
