package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"time"
)

// Storage is what durable needs of a storage shared by the instances of a
// cluster: certmagic.Storage's, less what it never uses. A key that is
// not there answers an error wrapping fs.ErrNotExist, as certmagic's
// storages do.
type Storage interface {
	Locker
	Store(ctx context.Context, key string, value []byte) error
	Load(ctx context.Context, key string) ([]byte, error)
	Delete(ctx context.Context, key string) error
	// List names the keys under prefix; a storage may list its
	// "directories" instead of the keys in them.
	List(ctx context.Context, prefix string, recursive bool) ([]string, error)
	// Modified is when key (a key or a directory of keys) was last
	// written.
	Modified(ctx context.Context, key string) (time.Time, error)
}

// StorageTimeout bounds one storage call. The saga waits for the
// journal's write-ahead ones, so a storage that hangs must fail the item
// (not sent) rather than hold the batch forever; and some are made after
// the request that needed them is gone (storing an answer, removing a
// journal, renewing a lease).
const StorageTimeout = 10 * time.Second

// FolderRemover is a storage whose folders outlive the keys in them (the
// file system's): RemoveEmptyFolder removes dir if nothing is in it, and
// leaves it, without an error, if something is. A storage whose folders
// go with their last key (Redis's) needs no such thing.
type FolderRemover interface {
	RemoveEmptyFolder(ctx context.Context, dir string) error
}

// AtomicRemover is a storage that deletes several keys at once, in one
// call (the Redis fast path): nobody sees some of them deleted and not
// the others, so a journal's removal needs no end marker to be safe to
// cut short. It deletes them only while a saga's lease is still the
// caller's, checked in the same call: an owner paused or cut off past
// its lease must not delete the journal of the instance that took the
// saga over (docs/durability.md, "A saga never writes after it lost its
// lease").
type AtomicRemover interface {
	// DeleteAllIf deletes keys if g holds, and otherwise nothing:
	// ErrKeyGone or ErrKeyChanged when g's key is not as g expects,
	// ErrOutranked when its folder lists a lease key that outranks it.
	DeleteAllIf(ctx context.Context, g LeaseGuard, keys []string) error
}

// LeaseGuard is the check of an AtomicRemover's removal: the lease key
// Key, of Epoch, holds Holds (or, with Absent, is not there; with
// neither, its value is not checked), and its folder lists no lease key
// of a higher epoch, nor another of Epoch.
type LeaseGuard struct {
	Key    string
	Epoch  int
	Holds  []byte
	Absent bool
}

// ErrOutranked is an AtomicRemover's answer when the lease's folder
// lists a lease key that outranks the guard's: another instance took the
// saga over.
var ErrOutranked = errors.New("the folder holds a lease key of a higher epoch, or another of the same epoch")

// removeEmptyFolder removes dir once its keys are deleted, where the
// storage keeps folders.
func removeEmptyFolder(ctx context.Context, s Storage, dir string) error {
	if fr, ok := s.(FolderRemover); ok {
		return fr.RemoveEmptyFolder(ctx, dir)
	}
	return nil
}

// loadJSON decodes the value stored at key into v; found is false, and v
// untouched, where there is none.
func loadJSON(ctx context.Context, s Storage, key string, v any) (found bool, err error) {
	b, err := s.Load(ctx, key)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return true, fmt.Errorf("decoding %s: %w", key, err)
	}
	return true, nil
}

// gone reports whether key is surely not in s: a read that fails
// otherwise says nothing, and comes back as the error.
func gone(ctx context.Context, s Storage, key string) (bool, error) {
	_, err := s.Modified(ctx, key)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	return false, err
}
