package redisfast

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-batch/caddy-batch/durable"
)

// The module's lock, by script: the same key and lifetime, so that a
// lock taken here and one taken by the module's Lock (this build on the
// generic path, or an older build) exclude each other. Locks tried or
// released at the same moment (a batch's item locks, all at once) go in
// one script: while one call is in flight, the next gathers every
// request that comes meanwhile. This process refreshes the locks it took
// itself (the module refreshes only its own Lock's): every
// refreshEvery, one script for all of them.
const (
	// lockTTL is the module's.
	lockTTL = 5 * time.Second
	// lockProven is how long a call that took or refreshed a lock
	// proves it: its life but a sixth, the margin a lease's fence keeps,
	// so that a write checked at the end of it still lands before
	// another holder can take the lock.
	lockProven = lockTTL - lockTTL/6
	// refreshEvery is the wait between two refreshes: a third of the
	// lock's life, not the module's 3 s, so that a proof, dated from
	// when its refresh began, is at most refreshEvery plus two refresh
	// calls old when the next lands, within lockProven while a refresh
	// takes up to 1.25 s.
	refreshEvery = lockTTL / 3
	// maxKeys bounds the keys of one script.
	maxKeys = 500
	// callTimeout bounds one script, whoever waits for it.
	callTimeout = durable.StorageTimeout
)

// lockTable is the locks one Store took, and the calls that take, free
// and refresh them.
type lockTable struct {
	s     *Store
	token string // the value of every lock this Store takes

	tries, frees batcher

	mu sync.Mutex
	// held are the locks held, each with when a call last proved it
	// (when the call that took or refreshed it began), and provenAll a
	// moment at or before every one of those: a saga asks before each
	// write whether any of its locks is lost (NoneLost), which this
	// answers without a look at each.
	held      map[string]time.Time
	provenAll time.Time
	// lost are the locks found lost while held, until released.
	lost       map[string]error
	refreshing bool
}

func newLockTable(s *Store) *lockTable {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	t := &lockTable{s: s, token: base64.RawURLEncoding.EncodeToString(b[:]), held: map[string]time.Time{}, lost: map[string]error{}}
	t.tries.run, t.frees.run = t.tryAll, t.freeAll
	return t
}

// TryLock takes name's lock if it is free, in one round trip shared with
// the locks tried at the same moment.
func (s *Store) TryLock(ctx context.Context, name string) (bool, error) {
	r := &request{name: name}
	s.locks.tries.do(ctx, r)
	return r.ok, r.err
}

// Lock takes name's lock, trying again every durable.LockPoll until ctx
// is done.
func (s *Store) Lock(ctx context.Context, name string) error {
	for {
		ok, err := s.TryLock(ctx, name)
		if ok || err != nil {
			return err
		}
		select {
		case <-time.After(durable.LockPoll):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Unlock lets go of name's lock if it is still this Store's, in one
// round trip shared with the locks let go at the same moment.
func (s *Store) Unlock(ctx context.Context, name string) error {
	r := &request{name: name}
	s.locks.frees.do(ctx, r)
	return r.err
}

// NoneLost reports that no lock this Store holds is lost, nor unproven
// for its lifetime: then LockLost is nil for each.
func (s *Store) NoneLost() bool {
	s.locks.mu.Lock()
	defer s.locks.mu.Unlock()
	return len(s.locks.lost) == 0 && ageOf(s.locks.provenAll) <= lockProven
}

// LockLost says why the lock name, held by this Store, is lost: another
// holder has it, or no refresh proved it for its lifetime (it may have
// lapsed); nil while it stands.
func (s *Store) LockLost(name string) error {
	s.locks.mu.Lock()
	defer s.locks.mu.Unlock()
	if err := s.locks.lost[name]; err != nil {
		return err
	}
	if proven, ok := s.locks.held[name]; ok && ageOf(proven) > lockProven {
		return fmt.Errorf("no refresh of the lock %s succeeded for %s of its %s: it may lapse before a write lands", name, lockProven, lockTTL)
	}
	return nil
}

// TryLockAll takes each of names' locks that is free, in one round trip
// for up to maxKeys of them (durable.GroupTryLocker), and answers, for
// each, whether it did.
func (s *Store) TryLockAll(ctx context.Context, names []string) ([]bool, error) {
	return s.locks.take(ctx, names)
}

// tryAll takes the locks of reqs.
func (t *lockTable) tryAll(ctx context.Context, reqs []*request) {
	names := make([]string, len(reqs))
	for i, r := range reqs {
		names[i] = r.name
	}
	got, err := t.take(ctx, names)
	for i, r := range reqs {
		if r.err = err; err == nil {
			r.ok = got[i]
		}
	}
}

// take takes each of names' locks that is free (lockScript), maxKeys
// at a time.
func (t *lockTable) take(ctx context.Context, names []string) ([]bool, error) {
	got := make([]bool, 0, len(names))
	for chunk := range slices.Chunk(names, maxKeys) {
		began := time.Now()
		keys := make([]string, len(chunk))
		for i, n := range chunk {
			keys[i] = t.s.lockKey(n)
		}
		res, err := t.s.eval(ctx, lockScript, keys, t.token, lockTTL.Milliseconds())
		answers, _ := res.([]any)
		if err == nil && len(answers) != len(chunk) {
			err = fmt.Errorf("the lock script answered %d results for %d locks", len(answers), len(chunk))
		}
		if err != nil {
			// Nobody will hold what the calls before took: let it go
			// now rather than when it lapses.
			t.letGo(ctx, names[:len(got)], got)
			return nil, err
		}
		t.mu.Lock()
		for i, n := range chunk {
			ok := answers[i] == int64(1)
			got = append(got, ok)
			if !ok {
				continue
			}
			if len(t.held) == 0 || began.Before(t.provenAll) {
				t.provenAll = began
			}
			t.held[n] = began
			delete(t.lost, n)
		}
		t.startRefresh()
		t.mu.Unlock()
	}
	return got, nil
}

// letGo lets go of those of names that got says were taken.
func (t *lockTable) letGo(ctx context.Context, names []string, got []bool) {
	var taken []string
	for i, n := range names {
		if got[i] {
			taken = append(taken, n)
		}
	}
	if len(taken) > 0 {
		_ = t.free(context.WithoutCancel(ctx), taken)
	}
}

// UnlockAll lets go of each of names' locks that is still this Store's,
// in one round trip (durable.GroupTryLocker).
func (s *Store) UnlockAll(ctx context.Context, names []string) error {
	return s.locks.free(ctx, names)
}

// freeAll lets go of the locks of reqs.
func (t *lockTable) freeAll(ctx context.Context, reqs []*request) {
	names := make([]string, len(reqs))
	for i, r := range reqs {
		names[i] = r.name
	}
	err := t.free(ctx, names)
	for _, r := range reqs {
		r.err = err
	}
}

// free runs unlockScript for names, maxKeys at a time.
func (t *lockTable) free(ctx context.Context, names []string) error {
	keys := make([]string, len(names))
	t.mu.Lock()
	for i, n := range names {
		keys[i] = t.s.lockKey(n)
		delete(t.held, n)
		delete(t.lost, n)
	}
	t.mu.Unlock()
	var errs []error
	for chunk := range slices.Chunk(keys, maxKeys) {
		errs = append(errs, t.s.run(ctx, unlockScript, chunk, t.token))
	}
	return errors.Join(errs...)
}

// startRefresh starts the refresh loop, unless it runs. t.mu is held.
func (t *lockTable) startRefresh() {
	if t.refreshing || len(t.held) == 0 {
		return
	}
	t.refreshing = true
	go t.refreshLoop()
}

// refreshLoop refreshes the locks held every refreshEvery, and ends once
// none is.
func (t *lockTable) refreshLoop() {
	for {
		time.Sleep(refreshEvery)
		if !t.refreshAll() {
			return
		}
	}
}

// refreshAll refreshes every lock held, and reports whether any was:
// with none, the refresh loop ends.
func (t *lockTable) refreshAll() bool {
	names, proven, ok := t.heldNow()
	if !ok {
		return false
	}
	for len(names) > 0 {
		n := min(len(names), maxKeys)
		began := time.Now()
		if lost, ok := t.extend(names[:n]); ok {
			t.proved(names[:n], proven[:n], lost, began)
		}
		names, proven = names[n:], proven[n:]
	}
	t.mu.Lock()
	t.provenAll = oldest(t.held)
	t.mu.Unlock()
	return true
}

// heldNow is every lock held, each with its proof, or false (the
// refresh loop then ends) when none is.
func (t *lockTable) heldNow() ([]string, []time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.held) == 0 {
		t.refreshing = false
		return nil, nil, false
	}
	names, proven := make([]string, 0, len(t.held)), make([]time.Time, 0, len(t.held))
	for n, p := range t.held {
		names, proven = append(names, n), append(proven, p)
	}
	return names, proven, true
}

// wallNow is the wall clock: a suspended VM stops the monotonic clock
// that time.Since reads, not this one, nor Redis's, which lets a lock
// lapse meanwhile.
var wallNow = func() time.Time { return time.Now().Round(0) }

// ageOf is how long ago proven was, on whichever clock says longer.
func ageOf(proven time.Time) time.Duration {
	return max(time.Since(proven), wallNow().Sub(proven.Round(0)))
}

// oldest is the earliest of held's proofs; now when none is held.
func oldest(held map[string]time.Time) time.Time {
	first := time.Now()
	for _, proven := range held {
		if proven.Before(first) {
			first = proven
		}
	}
	return first
}

// extend extends names' locks, and answers the indexes of those no
// longer this Store's; false when the call failed, which proves nothing
// and loses nothing.
func (t *lockTable) extend(names []string) (map[int]bool, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), refreshEvery)
	defer cancel()
	keys := make([]string, len(names))
	for i, n := range names {
		keys[i] = t.s.lockKey(n)
	}
	res, err := t.s.eval(ctx, refreshScript, keys, t.token, lockTTL.Milliseconds())
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, false
	}
	lost := map[int]bool{}
	if idx, ok := res.([]any); ok {
		for _, i := range idx {
			if n, ok := i.(int64); ok {
				lost[int(n)-1] = true
			}
		}
	}
	return lost, true
}

// proved records what an extend that began at began found of names, each
// held with the proof proven when it was asked: a lock let go meanwhile,
// or let go and taken again (its own take proved it, and the extend may
// have looked between the two), is left as it is now.
func (t *lockTable) proved(names []string, proven []time.Time, lost map[int]bool, began time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, n := range names {
		if p, still := t.held[n]; !still || !p.Equal(proven[i]) {
			continue
		}
		if lost[i] {
			t.lost[n] = fmt.Errorf("the lock %s in Redis is no longer this instance's (it lapsed, or was deleted)", n)
			delete(t.held, n)
			continue
		}
		t.held[n] = began
	}
}

// request is one lock's part in a shared call.
type request struct {
	name string
	ok   bool
	err  error
	done chan struct{}
}

// batcher runs requests that come at the same moment in one call: one
// call in flight at a time, the next taking every request that came
// meanwhile.
type batcher struct {
	run func(ctx context.Context, reqs []*request)

	mu       sync.Mutex
	queue    []*request
	inFlight bool
}

// do returns once r was part of a call.
func (b *batcher) do(ctx context.Context, r *request) {
	r.done = make(chan struct{})
	b.mu.Lock()
	b.queue = append(b.queue, r)
	if !b.inFlight {
		b.inFlight = true
		go b.flush(context.WithoutCancel(ctx))
	}
	b.mu.Unlock()
	<-r.done
}

// joinWindow is how long a call waits, before it takes its requests,
// for more to come: locks asked for by many goroutines at once should
// share a call, not trickle into several.
const joinWindow = 50 * time.Microsecond

// flush runs calls until no request waits.
func (b *batcher) flush(ctx context.Context) {
	time.Sleep(joinWindow)
	for {
		b.mu.Lock()
		reqs := b.queue
		if len(reqs) > maxKeys {
			reqs = reqs[:maxKeys]
		}
		b.queue = b.queue[len(reqs):]
		if len(reqs) == 0 {
			b.inFlight = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		callCtx, cancel := context.WithTimeout(ctx, callTimeout)
		b.run(callCtx, reqs)
		cancel()
		for _, r := range reqs {
			close(r.done)
		}
	}
}
