package redisfast

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"time"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// StoreIf checks and stores in one round trip (durable.GuardedStorer):
// an Idempotency-Key's claim checks that the record's lock (the
// module's key) is free and the record absent or as it was read, and
// files its expiry entry and the record, as the module's Store of each
// would, all in one script.
func (s *Store) StoreIf(ctx context.Context, free, key string, want []byte, writes []durable.KeyValue) ([]byte, error) {
	modified := time.Now()
	lock, mode, guarded := "", "absent", path.Join(s.prefix, key)
	keys := []string{guarded, guarded}
	if free != "" {
		lock, keys[0] = "lock", s.lockKey(free)
	}
	if want != nil {
		mode = "equals"
	}
	args := []any{lock, mode, base64.StdEncoding.EncodeToString(want), strconv.FormatInt(modified.Unix(), 10), len(writes)}
	for _, w := range writes {
		env, err := json.Marshal(&envelope{Value: w.Value, Modified: modified, Size: int64(len(w.Value))})
		if err != nil {
			return nil, fmt.Errorf("encoding %s: %w", w.Key, err)
		}
		chain, names := s.chain(w.Key)
		keys = append(keys, chain...)
		args = append(append(args, len(chain), env), names...)
	}
	res, err := s.eval(ctx, storeIfScript, keys, args...)
	if err != nil {
		return nil, fmt.Errorf("storing %s in Redis: %w", key, err)
	}
	return storedIf(key, free, res)
}

// storedIf is what storeIfScript answered: what the key held, and why
// nothing was stored.
func storedIf(key, free string, res any) ([]byte, error) {
	parts, _ := res.([]any)
	if len(parts) == 0 {
		return nil, fmt.Errorf("storing %s in Redis: the script answered %v", key, res)
	}
	var held []byte
	if len(parts) > 1 {
		raw, _ := parts[1].(string)
		var env envelope
		if err := json.Unmarshal([]byte(raw), &env); err != nil {
			return nil, fmt.Errorf("reading %s in Redis: %w", key, err)
		}
		held = env.Value
		if held == nil {
			held = []byte{}
		}
	}
	switch parts[0] {
	case int64(0):
		return held, nil
	case int64(1):
		return nil, fmt.Errorf("%w (the lock %s is held elsewhere)", itemlock.ErrLocked, free)
	case int64(2):
		return nil, durable.ErrKeyGone
	case int64(3):
		return held, durable.ErrKeyChanged
	case int64(4):
		return nil, durable.ErrUndecidable
	}
	return nil, fmt.Errorf("storing %s in Redis: the script answered %v", key, res)
}

// Interface guard
var _ durable.GuardedStorer = (*Store)(nil)
