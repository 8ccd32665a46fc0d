package caddymodule

import (
	"context"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-batch/caddy-batch/durable"
)

// durableStorage is a certmagic storage as durable sees it; a storage
// that can try a lock keeps that (tryStorage), so that durable never
// waits in Lock when it need not.
func durableStorage(s certmagic.Storage) durable.Storage {
	if s == nil {
		return nil
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

// Interface guards
var (
	_ durable.Storage   = certStorage{}
	_ durable.TryLocker = tryStorage{}
)
