package redisfast

import "time"

// Refresh refreshes every lock s holds, now, as its refresh loop does.
func Refresh(s *Store) { s.locks.refreshAll() }

// Age makes every proof of the locks s holds d older, as a refresh loop
// that failed for d would leave them.
func Age(s *Store, d time.Duration) {
	s.locks.mu.Lock()
	defer s.locks.mu.Unlock()
	for n, proven := range s.locks.held {
		s.locks.held[n] = proven.Add(-d)
	}
	s.locks.provenAll = s.locks.provenAll.Add(-d)
}

// RefreshAround refreshes every lock s holds as its refresh loop does,
// with before run once it listed them and after once Redis answered:
// what an Unlock and a TryLock of the process do meanwhile.
func RefreshAround(s *Store, before, after func()) {
	t := s.locks
	names, proven, _ := t.heldNow()
	before()
	began := time.Now()
	lost, ok := t.extend(names)
	after()
	if ok {
		t.proved(names, proven, lost, began)
	}
}

// Suspend makes the wall clock run d ahead of the monotonic one, as a
// VM suspended for d leaves them; the returned function puts it back.
func Suspend(d time.Duration) (resume func()) {
	was := wallNow
	wallNow = func() time.Time { return was().Add(d) }
	return func() { wallNow = was }
}
