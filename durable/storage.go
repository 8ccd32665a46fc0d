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
// cut short.
type AtomicRemover interface {
	DeleteAll(ctx context.Context, keys []string) error
}

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
