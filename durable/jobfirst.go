package durable

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"

	"github.com/caddy-batch/caddy-batch/batch"
)

// RunFirst runs the job's first item alone, a window of one through
// through, as Run runs any window: its result, its log and the progress
// stored after it, so that Run carries on from the second item. It is
// the job's proof that the route lets its client through (docs/jobs.md,
// "Start"): the batch handler runs before authentication, so the first
// request of a job is the first time the route's authentication sees its
// credentials. refused is the answer of that request when it was 401,
// 403 or 407 (an authentication's refusal, as the route wrote it), for
// the start to answer with, after Abandon; nil otherwise, an item that
// failed in another way included. err is the storage's, or the route's
// when no handler ran the window: what Run's would be.
func (hj *HeldJob) RunFirst(ctx context.Context, through Through) (refused *batch.SubResponse, err error) {
	if hj.rec.Items == 0 {
		return nil, nil
	}
	d, err := hj.newDriver(ctx)
	if err != nil {
		return nil, err
	}
	defer d.held.Release() // Run takes them again
	if d.p.Cursor > 0 {
		return nil, nil // carried on: the first item ran before
	}
	if err := hj.WriteProgress(ctx, d.p); err != nil {
		return nil, err
	}
	items, err := hj.ReadChunk(ctx, 0)
	if err != nil {
		return nil, err
	}
	keep := &keepLast{}
	watched := func(ctx context.Context, rec *JobRecord, cred http.Header, work func(batch.Site) error) error {
		return through(ctx, rec, cred, func(site batch.Site) error {
			keep.Sender, site.Runtime.Send = site.Runtime.Send, keep
			return work(site)
		})
	}
	if err := d.window(ctx, watched, nil, 0, items[:1]); err != nil {
		return nil, err
	}
	resp := keep.last()
	if resp == nil || !authRefusal(resp.Status) {
		return nil, nil
	}
	// The item's own outcome: a refused item is kept out of the results
	// (the job would pause on it), and one whose answer the results
	// keep is refused only if that answer is the last one.
	if line, ok := firstLine(hj.page.lines); ok && line.Status != resp.Status {
		return nil, nil
	}
	return resp, nil
}

// authRefusal reports whether status is an authentication's refusal: a
// job's first request so answered is no job.
func authRefusal(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired:
		return true
	}
	return false
}

// keepLast is a Sender that keeps the last answer it got: that of a
// window's one item, once any retry of it is over.
type keepLast struct {
	batch.Sender
	mu   sync.Mutex
	resp *batch.SubResponse
}

func (k *keepLast) Send(ctx context.Context, req *batch.SubRequest) (*batch.SubResponse, error) {
	resp, err := k.Sender.Send(ctx, req)
	if resp != nil {
		k.mu.Lock()
		k.resp = resp
		k.mu.Unlock()
	}
	return resp, err
}

func (k *keepLast) last() *batch.SubResponse {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.resp
}

// firstLine is the first of a results page's lines.
func firstLine(lines []byte) (ResultLine, bool) {
	first, _, _ := bytes.Cut(lines, []byte("\n"))
	var line ResultLine
	return line, json.Unmarshal(first, &line) == nil
}
