package durable

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/caddy-batch/caddy-batch/batch"
)

// A job's results are stored a page per window, batch/v1/jobs/<id>/
// results/<window first %08d>: a first line {"v":1,"first":F,"count":N},
// then one ResultLine a line for items F to F+N-1, in request order. The
// owner stores a window's page again as the window goes on; a reader
// streams the pages that follow each other without a gap, which is the
// longest finished prefix of the job, one page in memory at a time.

// ResultBodyLimit bounds the body a result line keeps, so that a page of
// a window stays small: a longer one is cut, at a UTF-8 boundary, into
// body_text.
const ResultBodyLimit = 4 << 10

// ResultLine is one item of a job's results: the item as a synchronous
// batch answers it, and whether its body was cut.
type ResultLine struct {
	batch.ItemResult
	BodyTruncated bool `json:"body_truncated,omitempty"`
}

// resultLine keeps it with its body cut to ResultBodyLimit, or as a
// job's window cut it already (batch.WindowOpts.KeepBody).
func resultLine(it batch.ItemResult) ResultLine {
	line := ResultLine{ItemResult: it, BodyTruncated: it.BodyCut()}
	if len(it.Body) > ResultBodyLimit {
		line.Body, line.BodyText, line.BodyTruncated = nil, cutUTF8(it.Body, ResultBodyLimit), true
	} else if len(it.BodyText) > ResultBodyLimit {
		line.BodyText, line.BodyTruncated = cutUTF8([]byte(it.BodyText), ResultBodyLimit), true
	}
	return line
}

// cutUTF8 is b cut to at most limit bytes, never inside a character.
func cutUTF8(b []byte, limit int) string {
	if len(b) > limit {
		n := limit
		for n > 0 && !utf8.RuneStart(b[n]) {
			n--
		}
		b = b[:n]
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// pageHead is the first line of a results page.
type pageHead struct {
	Version int `json:"v"`
	First   int `json:"first"`
	Count   int `json:"count"`
}

// resultsPage is the page of one window as its owner last stored it.
type resultsPage struct {
	loaded bool
	head   pageHead
	lines  []byte
}

// AppendResults adds the results of items, which follow those already
// stored for the window that begins at windowFirst (their Index is the
// item's index in the job), and stores the window's page again. The
// window's page is kept in memory until the next window's first append;
// one taken over is read back from storage.
func (hj *HeldJob) AppendResults(ctx context.Context, windowFirst int, items []batch.ItemResult) error {
	if err := hj.fence(ctx); err != nil {
		return err
	}
	p := &hj.page
	if !p.loaded || p.head.First != windowFirst {
		stored, err := loadPage(ctx, hj.jobs.storage, hj.rec.ID, windowFirst)
		if err != nil {
			return err
		}
		*p = stored
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	for i, it := range items {
		if want := windowFirst + p.head.Count + i; it.Index != want {
			return fmt.Errorf("the results of job %s go on at item %d, not %d: a page holds a finished prefix of its window", hj.rec.ID, want, it.Index)
		}
		if err := enc.Encode(resultLine(it)); err != nil {
			return err
		}
	}
	head := pageHead{Version: 1, First: windowFirst, Count: p.head.Count + len(items)}
	lines := append(slices.Clip(p.lines), buf.Bytes()...)
	hb, _ := json.Marshal(head)
	value := append(append(hb, '\n'), lines...)
	if err := hj.jobs.storage.Store(ctx, chunkKey(hj.rec.ID, resultsName, windowFirst), value); err != nil {
		return fmt.Errorf("storing the results of job %s from item %d: %w", hj.rec.ID, windowFirst, err)
	}
	p.head, p.lines = head, lines
	return nil
}

// loadPage reads the results page of the window at first: empty when
// none is stored.
func loadPage(ctx context.Context, s Storage, id string, first int) (resultsPage, error) {
	key := chunkKey(id, resultsName, first)
	b, err := s.Load(ctx, key)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return resultsPage{loaded: true, head: pageHead{Version: 1, First: first}}, nil
	case err != nil:
		return resultsPage{}, err
	}
	head, lines, err := splitPage(key, b)
	if err != nil {
		return resultsPage{}, err
	}
	if head.First != first {
		return resultsPage{}, fmt.Errorf("%s says it begins at item %d", key, head.First)
	}
	return resultsPage{loaded: true, head: head, lines: lines}, nil
}

// eachLine calls each with every result line of the page, in order, and
// its size without its newline, until each returns false.
func (p resultsPage) eachLine(id string, each func(line ResultLine, size int) bool) error {
	sc := bufio.NewScanner(bytes.NewReader(p.lines))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line ResultLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return fmt.Errorf("job %s's results from item %d: %w", id, p.head.First, err)
		}
		if !each(line, len(sc.Bytes())) {
			return nil
		}
	}
	return sc.Err()
}

// splitPage reads a stored page's first line, and the lines after it.
func splitPage(key string, b []byte) (pageHead, []byte, error) {
	first, lines, _ := bytes.Cut(b, []byte("\n"))
	var head pageHead
	if err := json.Unmarshal(first, &head); err != nil || head.Version != 1 {
		return head, nil, fmt.Errorf("%s: %w", key, errUnreadable)
	}
	return head, lines, nil
}

// Results streams the job id's results to page, for the holder of its
// token, a stored page at a time in request order, as far as the pages
// follow each other (the longest finished prefix: all of them once the
// job ended), and answers its status as it was before the first page.
// A reader's memory holds one page, whatever the job's size.
func (js *Jobs) Results(ctx context.Context, id, token string, page func([]byte) error) (*JobStatus, error) {
	st, err := js.ResultsIf(ctx, id, token, func(ResultsView) bool { return true }, page)
	if err != nil {
		return nil, err
	}
	return st.Status, nil
}

// ResultsView is what a reader of a job's results learns before the
// first page: the job's status, the path its batch was sent to, and the
// size of the results pages stored so far.
type ResultsView struct {
	Status *JobStatus
	Path   string
	// Bytes is the size of the stored pages' lines: the results' JSON
	// Lines, a line an item, each ending in a newline.
	Bytes int64
}

// ResultsIf is Results for a reader that must decide on what it answers
// before any page is read (an answer too large, or a job not ended yet):
// it streams the pages only when read, given the view, says so, and
// answers the view either way.
func (js *Jobs) ResultsIf(ctx context.Context, id, token string, read func(ResultsView) bool, page func([]byte) error) (ResultsView, error) {
	v, err := js.open(ctx, id, token)
	if err != nil {
		return ResultsView{}, err
	}
	view := ResultsView{Status: v.status(), Path: v.rec.Path, Bytes: v.progress.ResultsBytes}
	if !read(view) {
		return view, nil
	}
	dir := path.Join(jobDir(id), resultsName)
	names, err := listNames(ctx, js.storage, dir)
	if err != nil {
		return view, fmt.Errorf("listing the results of job %s: %w", id, err)
	}
	firsts := make([]int, 0, len(names))
	for _, name := range names {
		if n, err := strconv.Atoi(name); err == nil {
			firsts = append(firsts, n)
		}
	}
	slices.Sort(firsts)
	next := 0
	for _, first := range firsts {
		if first != next {
			break // a window before it is not finished
		}
		p, err := loadPage(ctx, js.storage, id, first)
		if err != nil {
			return view, err
		}
		if err := page(p.lines); err != nil {
			return view, err
		}
		next = first + p.head.Count
	}
	return view, nil
}
