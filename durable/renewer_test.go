package durable

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
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

// stubClaimer is a memStorage whose one-call claims answer err.
type stubClaimer struct {
	*memStorage
	err error
}

func (s stubClaimer) ClaimLease(context.Context, string, int, string, []byte, []byte) error {
	return s.err
}

// TestTakeoverClaimAtOnce: what a storage that claims a lease in one call answers is
// read as the claim in several calls reads it: an old record gone or
// changed, or a lease key that outranks the claim, steps back, with
// nothing written by this process; a failed call is an error of the
// claim; a value the storage cannot compare goes the generic way.
func TestTakeoverClaimAtOnce(t *testing.T) {
	key := leaseKeyOf("s", 1, Owner())
	for _, tc := range []struct {
		name    string
		err     error
		stepped bool
		failed  bool
		generic bool
	}{
		{"claimed", nil, false, false, false},
		{"old record gone", ErrKeyGone, true, false, false},
		{"old record changed", ErrKeyChanged, true, false, false},
		{"outranked", ErrOutranked, true, false, false},
		{"the call failed", errors.New("timeout"), false, true, false},
		{"undecidable", ErrUndecidable, false, false, true},
	} {
		s := stubClaimer{newMemStorage(), tc.err}
		js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
		doing, err := js.claimKey(context.Background(), "s", leaseView{}, 1, key, []byte("rec"))
		_, stored := s.memStorage.Load(context.Background(), key)
		switch {
		case tc.stepped != errors.Is(err, errSteppedBack) || tc.stepped && doing != "":
			t.Errorf("%s: %q %v, stepped back %v", tc.name, doing, err, tc.stepped)
		case tc.failed != (err != nil && doing != ""):
			t.Errorf("%s: %q %v, failed %v", tc.name, doing, err, tc.failed)
		case tc.generic != (stored == nil):
			t.Errorf("%s: stored by the generic way %v, want %v", tc.name, stored == nil, tc.generic)
		case !tc.stepped && !tc.failed && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
