package durable

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// A job's input is stored before the job is made, as the start's body is
// read: chunks batch/v1/jobs/<id>/input/<first %08d>, each a first line
// {"v":1,"first":F,"count":N} and then one item a line (its id, element
// and fields), so that any instance pages through a job by index with no
// manifest. A staging whose start never registers (the client went, the
// instance died) is swept by its expiry entry, filed before the first
// chunk.

// Staging is a job's input being stored, before the job is registered.
type Staging struct {
	jobs    *Jobs
	id      string
	expires time.Time
	ttl     time.Duration
}

// Stage begins storing a job's input; what is staged and not registered
// within ttl is swept.
func (js *Jobs) Stage(ctx context.Context, ttl time.Duration) (*Staging, error) {
	st := &Staging{jobs: js, id: NewID(), expires: now().Add(ttl), ttl: ttl}
	if err := fileJobExpiry(ctx, js.storage, st.id, st.expires, ttl); err != nil {
		return nil, err
	}
	return st, nil
}

// ID is the id the job will have.
func (st *Staging) ID() string { return st.id }

// Chunk stores items as the chunk of the input that begins at item first.
func (st *Staging) Chunk(ctx context.Context, first int, items []batch.ItemSnapshot) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(pageHead{Version: 1, First: first, Count: len(items)}); err != nil {
		return err
	}
	for _, it := range items {
		// As sent, and nothing a run adds: an envelope's operation keeps
		// its id, method and url, and what it depends on.
		in := batch.ItemSnapshot{ID: it.ID, Element: it.Element, Fields: it.Fields,
			OperationID: it.OperationID, Method: it.Method, URL: it.URL, Deps: it.Deps}
		if err := enc.Encode(in); err != nil {
			return err
		}
	}
	if err := st.jobs.storage.Store(ctx, chunkKey(st.id, inputName, first), buf.Bytes()); err != nil {
		return fmt.Errorf("storing items %d to %d of a job: %w", first, first+len(items)-1, err)
	}
	return nil
}

// Discard deletes what was staged, and its expiry entry last: a start
// refused after its body was read leaves nothing. What it cannot delete
// is logged, and swept once its entry's time is up.
func (st *Staging) Discard(ctx context.Context) {
	s := st.jobs.storage
	err := errors.Join(
		deleteFolder(ctx, s, path.Join(jobDir(st.id), inputName)),
		removeEmptyFolder(ctx, s, jobDir(st.id)),
		deleteKey(ctx, s, jobExpiryKey(st.id, st.expires, st.ttl)),
	)
	if err != nil {
		st.jobs.logger.Warn("discarding a refused job's input; the sweep deletes it later", zap.String("job", st.id), zap.Error(err))
	}
}

// ReadChunk reads the chunk of the job's input that begins at item first.
func (hj *HeldJob) ReadChunk(ctx context.Context, first int) ([]batch.ItemSnapshot, error) {
	key := chunkKey(hj.rec.ID, inputName, first)
	b, err := hj.jobs.storage.Load(ctx, key)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("job %s has no input chunk at item %d: %w", hj.rec.ID, first, err)
	}
	if err != nil {
		return nil, err
	}
	head, lines, err := splitPage(key, b)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(lines))
	items := make([]batch.ItemSnapshot, head.Count)
	for i := range items {
		if err := dec.Decode(&items[i]); err != nil {
			return nil, fmt.Errorf("%s, item %d: %w", key, head.First+i, err)
		}
	}
	return items, nil
}
