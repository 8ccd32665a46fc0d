package batchapp

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/redisfast"
)

// DurableStorage is a certmagic storage as durable sees it: the Redis
// fast path where it applies (StoragePath), else a storage that can try
// a lock keeps that (tryStorage), so that durable never waits in Lock
// when it need not.
func DurableStorage(s certmagic.Storage) durable.Storage {
	if s == nil {
		return nil
	}
	generic := genericStorage(s)
	if fast, _ := redisfast.For(s, generic); fast != nil {
		return fast
	}
	return generic
}

// StoragePath says which way the storage is used: "redis" (the fast
// path), or "generic" and why the fast path does not apply.
func StoragePath(s certmagic.Storage) (path, why string) {
	if s == nil {
		return "generic", "no storage"
	}
	if fast, why := redisfast.For(s, genericStorage(s)); fast == nil {
		return "generic", why
	}
	return "redis", ""
}

func genericStorage(s certmagic.Storage) durable.Storage {
	if files, ok := s.(*certmagic.FileStorage); ok {
		return fileStorage{tryStorage{certStorage{s}, files}, files}
	}
	if tl, ok := s.(certmagic.TryLocker); ok {
		return tryStorage{certStorage{s}, tl}
	}
	return certStorage{s}
}

type certStorage struct{ certmagic.Storage }

func (s certStorage) Modified(ctx context.Context, key string) (time.Time, error) {
	info, err := s.Stat(ctx, key)
	return info.Modified, err
}

type tryStorage struct {
	certStorage
	certmagic.TryLocker
}

// fileStorage is the file system storage, whose folders outlive their
// keys.
type fileStorage struct {
	tryStorage
	fs *certmagic.FileStorage
}

// RemoveEmptyFolder removes dir if it is empty; one that is not, or is
// gone, is left alone.
func (s fileStorage) RemoveEmptyFolder(_ context.Context, dir string) error {
	err := os.Remove(s.fs.Filename(dir))
	if err == nil || errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
		return nil
	}
	return err
}

// List lists as certmagic's does, but for a key that vanished while the
// folder was walked (deleted, or the temporary file of a write renamed
// into its key: a job's lease renewals write in its folder every third
// of a lease): certmagic's walk then fails the whole listing as if the
// folder were missing, which a reader would take for "no keys". Such a
// listing is taken again; the folder's own absence stands.
func (s fileStorage) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	folder := s.fs.Filename(prefix)
	for try := 1; ; try++ {
		keys, err := s.tryStorage.List(ctx, prefix, recursive)
		var pe *fs.PathError
		if try == listTries || !errors.As(err, &pe) || !errors.Is(err, fs.ErrNotExist) || pe.Path == folder {
			return keys, err
		}
	}
}

// listTries bounds the listings of a folder whose keys keep vanishing
// while it is walked.
const listTries = 5

// SerialStores makes the journal store one segment at a time
// (durable.SerialStorer): each is a synced file.
func (fileStorage) SerialStores() {}

// Interface guards
var (
	_ durable.Storage       = certStorage{}
	_ durable.TryLocker     = tryStorage{}
	_ durable.FolderRemover = fileStorage{}
	_ durable.SerialStorer  = fileStorage{}
)
