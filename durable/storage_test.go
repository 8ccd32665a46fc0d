package durable

import (
	"context"
	"fmt"
	"io/fs"
	"iter"
	"slices"
	"strings"
	"sync"
	"time"
)

// memStorage is a Storage in memory, shared by the "instances" of a
// test as a cluster shares one; it counts its writes and can be made to
// fail them.
type memStorage struct {
	*memLocks
	mu       sync.Mutex
	keys     map[string][]byte
	modified map[string]time.Time
	stores   int
	fail     error // returned by Store when set
	// flat makes Delete delete one key only, as the Redis module's does
	// (a folder's keys stay), and answer nil for a key not there.
	flat bool
	// failDelete is returned by Delete when set.
	failDelete error
	// unlisted are folders whose listing is lost while their keys stay,
	// as the Redis module leaves a folder an older build deleted.
	unlisted map[string]bool
	// listedOnly are keys listed that hold nothing, as the Redis module
	// leaves a key whose writer died between listing it and setting it.
	listedOnly map[string]bool
}

func newMemStorage() *memStorage {
	return &memStorage{memLocks: newMemLocks(), keys: map[string][]byte{}, modified: map[string]time.Time{}, unlisted: map[string]bool{}, listedOnly: map[string]bool{}}
}

func (s *memStorage) Store(_ context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.stores++
	delete(s.listedOnly, key)
	s.keys[key] = append([]byte(nil), value...)
	s.modified[key] = time.Now()
	return nil
}

func (s *memStorage) Load(_ context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.keys[key]
	if !ok {
		return nil, fmt.Errorf("%s: %w", key, fs.ErrNotExist)
	}
	return v, nil
}

// Delete deletes key, or every key under it, as the file system storage
// deletes a directory.
func (s *memStorage) Delete(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failDelete != nil {
		return s.failDelete
	}
	for k := range s.listedOnly {
		if k == key || !s.flat && strings.HasPrefix(k, key+"/") {
			delete(s.listedOnly, k)
		}
	}
	if s.flat {
		delete(s.keys, key)
		return nil
	}
	found := false
	for k := range s.keys {
		if k == key || strings.HasPrefix(k, key+"/") {
			delete(s.keys, k)
			found = true
		}
	}
	if !found {
		return fmt.Errorf("%s: %w", key, fs.ErrNotExist)
	}
	return nil
}

// List lists the keys and "directories" right under prefix.
func (s *memStorage) List(_ context.Context, prefix string, _ bool) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unlisted[prefix] {
		return nil, nil
	}
	var out []string
	seen := map[string]bool{}
	for k := range s.allListed() {
		rest, ok := strings.CutPrefix(k, prefix+"/")
		if !ok {
			continue
		}
		first, _, _ := strings.Cut(rest, "/")
		if name := prefix + "/" + first; !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: %w", prefix, fs.ErrNotExist)
	}
	slices.Sort(out)
	return out, nil
}

// allListed are the keys a listing shows: those holding a value and
// those listed only. s.mu is held.
func (s *memStorage) allListed() iter.Seq[string] {
	return func(yield func(string) bool) {
		for k := range s.keys {
			if !yield(k) {
				return
			}
		}
		for k := range s.listedOnly {
			if !yield(k) {
				return
			}
		}
	}
}

// listOnly lists key without giving it a value.
func (s *memStorage) listOnly(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listedOnly[key] = true
}

// Modified is the latest write to key or under it.
func (s *memStorage) Modified(_ context.Context, key string) (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var latest time.Time
	for k, t := range s.modified {
		if _, ok := s.keys[k]; ok && (k == key || strings.HasPrefix(k, key+"/")) && t.After(latest) {
			latest = t
		}
	}
	if latest.IsZero() {
		return latest, fmt.Errorf("%s: %w", key, fs.ErrNotExist)
	}
	return latest, nil
}

// age makes every write under key look d older.
func (s *memStorage) age(key string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, t := range s.modified {
		if k == key || strings.HasPrefix(k, key+"/") {
			s.modified[k] = t.Add(-d)
		}
	}
}

// failDeletes makes every later Delete answer err (nil: succeed).
func (s *memStorage) failDeletes(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failDelete = err
}

// keysUnder are the keys under prefix, sorted.
func (s *memStorage) keysUnder(prefix string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.keys {
		if strings.HasPrefix(k, prefix+"/") {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// failStores makes every later Store answer err (nil: succeed).
func (s *memStorage) failStores(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = err
}

func (s *memStorage) count() (keys, stores int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys) + len(s.listedOnly), s.stores
}

var _ Storage = (*memStorage)(nil)

// counting wraps a storage and counts the requests made of it, by kind:
// what tests of the storage's cost assert (never time or CPU).
type counting struct {
	Storage
	mu     sync.Mutex
	counts map[string]int
}

func newCounting(s Storage) *counting { return &counting{Storage: s, counts: map[string]int{}} }

func (c *counting) add(op string) {
	c.mu.Lock()
	c.counts[op]++
	c.mu.Unlock()
}

// take returns the counts so far, and starts again from zero.
func (c *counting) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.counts
	c.counts = map[string]int{}
	return out
}

func (c *counting) Store(ctx context.Context, key string, value []byte) error {
	c.add("store")
	return c.Storage.Store(ctx, key, value)
}

func (c *counting) Load(ctx context.Context, key string) ([]byte, error) {
	c.add("load")
	return c.Storage.Load(ctx, key)
}

func (c *counting) Delete(ctx context.Context, key string) error {
	c.add("delete")
	return c.Storage.Delete(ctx, key)
}

func (c *counting) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	c.add("list")
	return c.Storage.List(ctx, prefix, recursive)
}

func (c *counting) Modified(ctx context.Context, key string) (time.Time, error) {
	c.add("modified")
	return c.Storage.Modified(ctx, key)
}

func (c *counting) Lock(ctx context.Context, name string) error {
	c.add("lock")
	return c.Storage.Lock(ctx, name)
}

func (c *counting) TryLock(ctx context.Context, name string) (bool, error) {
	c.add("lock")
	return c.Storage.(TryLocker).TryLock(ctx, name)
}

func (c *counting) Unlock(ctx context.Context, name string) error {
	c.add("unlock")
	return c.Storage.Unlock(ctx, name)
}

// valuesUnder are the keys under prefix and their values.
func (s *memStorage) valuesUnder(prefix string) map[string][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]byte{}
	for k, v := range s.keys {
		if strings.HasPrefix(k, prefix+"/") {
			out[k] = slices.Clone(v)
		}
	}
	return out
}
