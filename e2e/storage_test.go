package e2e

import (
	"context"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-batch/caddy-batch/durable"
)

// durableStorage is a Caddy storage as the durable package reads and
// writes it, for the tests that look at or fill in what gateways keep in
// a shared storage, as another instance of the cluster would.
func durableStorage(s certmagic.Storage) durable.Storage { return certStorage{s} }

type certStorage struct{ certmagic.Storage }

func (s certStorage) Modified(ctx context.Context, key string) (time.Time, error) {
	info, err := s.Stat(ctx, key)
	return info.Modified, err
}
