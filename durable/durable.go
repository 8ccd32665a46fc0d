// Package durable is what outlives a request, over a small storage
// interface (Storage) and with no Caddy import (docs/architecture.md):
// the owner id of this process among the instances sharing a storage,
// the one lease of the process and the loop that renews what it holds,
// the one way to take a storage lock, item locks held in the storage, the
// saga journal (docs/durability.md, "Durability: the saga journal"), the
// Idempotency-Key records and the decision of a claim (docs/durability.md,
// "Idempotency-Key replay"), the bulk jobs' store (docs/durability.md,
// "Bulk jobs in storage"), and the recovery scan that takes over the
// sagas of dead owners and the sweeps of what is left behind. The
// gateway adapts its storage to Storage, fills a saga's Origin, turns a
// claim's Decision into an answer, and finishes a taken-over saga.
package durable

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
)

// Locker is what durable needs of a storage to lock names in it:
// certmagic.Storage's Lock and Unlock. Lock blocks until the lock is had
// or ctx is done; Unlock releases it.
type Locker interface {
	Lock(ctx context.Context, name string) error
	Unlock(ctx context.Context, name string) error
}

// TryLocker is a Locker that can try a lock without waiting for it
// (certmagic.TryLocker): it reports whether it took the lock.
type TryLocker interface {
	TryLock(ctx context.Context, name string) (bool, error)
}

// GroupTryLocker is a TryLocker that tries several locks in one round
// trip (the Redis fast path): a batch's item locks, all or none.
type GroupTryLocker interface {
	TryLocker
	// TryLockAll takes each of names' locks that is free, and answers,
	// for each, whether it did. On an error it may have taken some,
	// which then lapse as a lock whose holder died does.
	TryLockAll(ctx context.Context, names []string) ([]bool, error)
	// UnlockAll lets go of names' locks, in one round trip.
	UnlockAll(ctx context.Context, names []string) error
}

// Owner names this process among the instances sharing a storage: the
// owner of the sagas it runs and of the Idempotency-Key records it
// claims. It is kept in memory only, so a process that restarts is a new
// owner, and what the dead one held is taken over once its leases lapse.
var Owner = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), NewID())
})

// NewID is a random name for something stored (a saga), in hex so that no
// storage mangles it.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}
