package durable

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"path"
	"strings"
	"sync"
	"time"
)

// countingStorage is a memStorage whose every call takes a round trip
// of rt (fake time, in a bubble) and is counted, by what it was for:
// the elapsed time of a batch over it, in round trips, is the number of
// storage calls it made one after another.
type countingStorage struct {
	*memStorage
	rt time.Duration

	mu    sync.Mutex
	calls map[string]int // by "op purpose", as purpose names them
	// absent are the Deletes of keys that were not there.
	absent []string
}

func newCountingStorage(rt time.Duration) *countingStorage {
	return &countingStorage{memStorage: newMemStorage(), rt: rt, calls: map[string]int{}}
}

// purpose names what a key or a lock name is for.
func purpose(key string) string {
	switch {
	case strings.HasPrefix(key, "batch_item_"):
		return "item lock"
	case strings.HasSuffix(key, "/"+endName):
		return "end marker"
	case strings.HasPrefix(key, journalPrefix):
		return "journal"
	}
	return "other"
}

func (c *countingStorage) count(op, key string) {
	time.Sleep(c.rt)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[op+" "+purpose(key)]++
}

func (c *countingStorage) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.calls {
		out[k] = v
	}
	return out
}

func (c *countingStorage) Store(ctx context.Context, key string, value []byte) error {
	c.count("store", key)
	return c.memStorage.Store(ctx, key, value)
}

func (c *countingStorage) Load(ctx context.Context, key string) ([]byte, error) {
	c.count("load", key)
	return c.memStorage.Load(ctx, key)
}

func (c *countingStorage) Delete(ctx context.Context, key string) error {
	c.count("delete", key)
	if _, err := c.memStorage.Load(ctx, key); err != nil {
		c.mu.Lock()
		c.absent = append(c.absent, key)
		c.mu.Unlock()
	}
	return c.memStorage.Delete(ctx, key)
}

func (c *countingStorage) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	c.count("list", prefix+"/")
	return c.memStorage.List(ctx, prefix, recursive)
}

func (c *countingStorage) Modified(ctx context.Context, key string) (time.Time, error) {
	c.count("modified", key)
	return c.memStorage.Modified(ctx, key)
}

func (c *countingStorage) TryLock(ctx context.Context, name string) (bool, error) {
	c.count("lock", name)
	return c.memLocks.TryLock(ctx, name)
}

func (c *countingStorage) Lock(ctx context.Context, name string) error {
	c.count("lock", name)
	return c.memLocks.Lock(ctx, name)
}

func (c *countingStorage) Unlock(ctx context.Context, name string) error {
	c.count("unlock", name)
	return c.memLocks.Unlock(ctx, name)
}

// atomicCounting is a countingStorage that deletes several keys in one
// call (AtomicRemover), as the Redis fast path does.
type atomicCounting struct{ *countingStorage }

func (a atomicCounting) DeleteAllIf(ctx context.Context, g LeaseGuard, keys []string) error {
	a.count("delete all", journalPrefix)
	if err := checkLeaseGuard(ctx, a.memStorage, g); err != nil {
		return err
	}
	for _, k := range keys {
		if err := a.memStorage.Delete(ctx, k); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// checkLeaseGuard is an AtomicRemover's check of g, as the Redis fast
// path's script makes it (uncounted: it is part of the one call).
func checkLeaseGuard(ctx context.Context, s Storage, g LeaseGuard) error {
	b, err := s.Load(ctx, g.Key)
	switch {
	case errors.Is(err, fs.ErrNotExist) && g.Holds != nil:
		return ErrKeyGone
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return err
	case err == nil && g.Absent, err == nil && g.Holds != nil && !bytes.Equal(b, g.Holds):
		return ErrKeyChanged
	}
	names, err := listNames(ctx, s, path.Dir(g.Key))
	if err != nil {
		return err
	}
	if outranks(names, g.Epoch, g.Key) != nil {
		return ErrOutranked
	}
	return nil
}
