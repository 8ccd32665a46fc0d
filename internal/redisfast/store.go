package redisfast

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-batch/caddy-batch/durable"
)

// Store is the storage on the fast path: Store, Delete and the locks by
// script, everything else (Load, List, Modified) by the module itself.
type Store struct {
	durable.Storage
	conn   func(context.Context) (*redis.Client, error)
	prefix string
	locks  *lockTable
}

func newStore(generic durable.Storage, conn func(context.Context) (*redis.Client, error), prefix string) *Store {
	s := &Store{Storage: generic, conn: conn, prefix: prefix}
	s.locks = newLockTable(s)
	return s
}

// envelope is the module's StorageData, field for field and in order,
// so that json.Marshal gives the module's bytes: the value in standard
// base64, when it was stored, its size, and no compression or
// encryption.
type envelope struct {
	Value       []byte    `json:"value"`
	Modified    time.Time `json:"modified"`
	Size        int64     `json:"size"`
	Compression int       `json:"compression"`
	Encryption  int       `json:"encryption"`
}

// Store stores value under key as the module's Store does, in one round
// trip.
func (s *Store) Store(ctx context.Context, key string, value []byte) error {
	modified := time.Now()
	b, err := json.Marshal(&envelope{Value: value, Modified: modified, Size: int64(len(value))})
	if err != nil {
		return fmt.Errorf("encoding %s: %w", key, err)
	}
	keys, names := s.chain(key)
	args := append([]any{b, strconv.FormatInt(modified.Unix(), 10)}, names...)
	if err := s.run(ctx, storeScript, keys, args...); err != nil {
		return fmt.Errorf("storing %s in Redis: %w", key, err)
	}
	return nil
}

// Delete deletes key as the module's Delete does, in one round trip.
func (s *Store) Delete(ctx context.Context, key string) error {
	return s.DeleteAll(ctx, []string{key})
}

// DeleteAll deletes keys as the module's Delete of each in turn would,
// in one round trip and at once (durable.AtomicRemover): nobody sees
// some deleted and not others.
func (s *Store) DeleteAll(ctx context.Context, keys []string) error {
	all, args := s.deletion(keys)
	if err := s.run(ctx, deleteScript, all, args...); err != nil {
		return fmt.Errorf("deleting %s in Redis: %w", strings.Join(keys, ", "), err)
	}
	return nil
}

// DeleteAllIf is DeleteAll under g, checked in the same script
// (durable.AtomicRemover): a saga's journal goes only while its lease
// is still this process's (docs/durability.md, "The Redis fast path").
func (s *Store) DeleteAllIf(ctx context.Context, g durable.LeaseGuard, keys []string) error {
	lease := path.Join(s.prefix, g.Key)
	mode := ""
	switch {
	case g.Holds != nil:
		mode = "equals"
	case g.Absent:
		mode = "absent"
	}
	all, del := s.deletion(keys)
	args := append([]any{mode, base64.StdEncoding.EncodeToString(g.Holds), g.Epoch, path.Base(g.Key)}, del...)
	res, err := s.eval(ctx, deleteIfScript, append([]string{lease, path.Dir(lease)}, all...), args...)
	if err != nil {
		return fmt.Errorf("deleting %s in Redis: %w", strings.Join(keys, ", "), err)
	}
	return guardVerdict(res, "deleting "+strings.Join(keys, ", "))
}

// deletion is deleteScript's KEYS and ARGV for keys.
func (s *Store) deletion(keys []string) (all []string, args []any) {
	args = []any{len(keys)}
	for _, key := range keys {
		chain, names := s.chain(key)
		all = append(all, chain...)
		args = append(append(args, len(chain)), names...)
	}
	return all, args
}

// RenewLease renews a lease in one round trip (durable.LeaseRenewer):
// the check, the module's Store of next, and the listing of its folder.
func (s *Store) RenewLease(ctx context.Context, key string, prev []byte, guard string, next []byte) ([]string, error) {
	modified := time.Now()
	env, err := json.Marshal(&envelope{Value: next, Modified: modified, Size: int64(len(next))})
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", key, err)
	}
	keys, names := s.chain(key)
	mode := "prev"
	if prev == nil {
		mode = "guard"
		keys = append(keys, path.Join(s.prefix, guard))
	} else {
		// The guard's place: the script reads its keys' count.
		keys = append(keys, keys[0])
	}
	args := append([]any{mode, base64.StdEncoding.EncodeToString(prev), env, strconv.FormatInt(modified.Unix(), 10)}, names...)
	res, err := s.eval(ctx, renewScript, keys, args...)
	if err != nil {
		return nil, fmt.Errorf("renewing %s in Redis: %w", key, err)
	}
	return renewed(key, res)
}

// ClaimLease stores a takeover's lease key in one round trip
// (durable.LeaseClaimer): the check of the old record and of the
// folder's lease keys, and the module's Store of next.
func (s *Store) ClaimLease(ctx context.Context, key string, epoch int, seenKey string, seen, next []byte) error {
	modified := time.Now()
	env, err := json.Marshal(&envelope{Value: next, Modified: modified, Size: int64(len(next))})
	if err != nil {
		return fmt.Errorf("encoding %s: %w", key, err)
	}
	keys, names := s.chain(key)
	mode := "nolease"
	if seenKey != "" {
		mode = "equals"
		if seen == nil {
			mode = "unset" // listed with no value: a Store cut short
		}
		keys = append(keys, path.Join(s.prefix, seenKey))
	} else {
		// The old key's place: the script reads its keys' count.
		keys = append(keys, keys[0])
	}
	args := append([]any{mode, base64.StdEncoding.EncodeToString(seen), epoch, path.Base(key), env, strconv.FormatInt(modified.Unix(), 10)}, names...)
	res, err := s.eval(ctx, claimScript, keys, args...)
	if err != nil {
		return fmt.Errorf("claiming %s in Redis: %w", key, err)
	}
	return guardVerdict(res, "claiming "+key)
}

// renewed is what renewScript answered.
func renewed(key string, res any) ([]string, error) {
	switch res {
	case int64(1):
		return nil, durable.ErrKeyGone
	case int64(2):
		return nil, durable.ErrKeyChanged
	case int64(3):
		return nil, durable.ErrUndecidable
	}
	parts, ok := res.([]any)
	if !ok || len(parts) != 2 {
		return nil, fmt.Errorf("renewing %s in Redis: the script answered %v", key, res)
	}
	members, _ := parts[1].([]any)
	names := make([]string, 0, len(members))
	for _, m := range members {
		if n, ok := m.(string); ok {
			names = append(names, n)
		}
	}
	return names, nil
}

// chain is the Redis key of key, then the folders it is listed in, from
// its own upward, with the name it has in each (a folder's with a
// trailing slash), as the module's folder index has them.
func (s *Store) chain(key string) (keys []string, names []any) {
	k := path.Join(s.prefix, key)
	keys = []string{k}
	for base, dir := path.Base(k), path.Dir(k); dir != "." && dir != "/"; base, dir = path.Base(dir)+"/", path.Dir(dir) {
		keys = append(keys, dir)
		names = append(names, base)
	}
	return keys, names
}

// lockKey is the module's Redis key of the lock name.
func (s *Store) lockKey(name string) string { return path.Join(s.prefix, "locks", name) }

// run runs script on the Redis that holds every key.
func (s *Store) run(ctx context.Context, script *redis.Script, keys []string, args ...any) error {
	_, err := s.eval(ctx, script, keys, args...)
	return err
}

func (s *Store) eval(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	c, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	return script.Run(ctx, c, keys, args...).Result()
}

// Interface guards
var (
	_ durable.Storage        = (*Store)(nil)
	_ durable.TryLocker      = (*Store)(nil)
	_ durable.GroupTryLocker = (*Store)(nil)
	_ durable.LockLoser      = (*Store)(nil)
	_ durable.AtomicRemover  = (*Store)(nil)
	_ durable.LeaseClaimer   = (*Store)(nil)
)

// guardVerdict is what the answer of a script guarded by the lease
// (deleteIfScript, claimScript) means: 0 done, or why it wrote nothing.
// doing names the call, for an answer no script gives.
func guardVerdict(res any, doing string) error {
	switch res {
	case int64(0):
		return nil
	case int64(1):
		return durable.ErrKeyGone
	case int64(2):
		return durable.ErrKeyChanged
	case int64(3):
		return durable.ErrOutranked
	case int64(4):
		return durable.ErrUndecidable
	}
	return fmt.Errorf("%s in Redis: the script answered %v", doing, res)
}
