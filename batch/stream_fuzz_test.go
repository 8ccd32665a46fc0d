package batch

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// The stream fuzzers check that a job is admitted exactly when a
// synchronous batch of the same elements would be, under the same limits,
// with the same items; and that an array and JSON Lines of the same
// elements are one job.

// fuzzJobLimits are the synchronous limits of m, as a job's.
func fuzzJobLimits(m policy.Match) JobLimits {
	s := m.Resource.Settings
	return JobLimits{MaxItems: s.MaxItems, MaxAtomic: s.MaxItems, MaxBody: s.MaxBodySize, MaxElement: s.MaxBodySize}
}

// streamed admits body as a job of op on m; contentType "" sends none.
func streamed(m policy.Match, op policy.Op, body []byte, contentType string) admitted {
	method := map[policy.Op]string{policy.OpCreate: http.MethodPost, policy.OpUpdate: http.MethodPatch}[op]
	r := &http.Request{
		Method: method, URL: &url.URL{Path: "/widgets"}, Header: http.Header{},
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
	}
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	lim := fuzzJobLimits(m)
	return admitOn(m, r, func(l *JobLimits) { *l = lim })
}

// synchronous parses body as a synchronous batch of op on m.
func synchronous(m policy.Match, op policy.Op, body []byte) *Plan {
	r := &http.Request{
		Method: http.MethodPost, URL: &url.URL{Path: "/widgets"}, Header: http.Header{},
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
	}
	p, _ := parsePlan(r, m, op)
	return p
}

// agree fails t unless the job was admitted exactly when the batch was,
// with the same items.
func agree(t *testing.T, op policy.Op, job admitted, batch *Plan) {
	t.Helper()
	if job.prob != nil {
		checkProblem(t, job.prob.Status)
	}
	switch {
	case batch == nil && job.prob == nil:
		t.Fatalf("%s: a job admitted %d items a synchronous batch refuses", op, job.plan.Items)
	case batch != nil && job.prob != nil:
		t.Fatalf("%s: a job refused what a synchronous batch admits: %d %s", op, job.prob.Status, job.prob.Detail)
	case batch == nil:
		return
	}
	if want := batch.Snapshot().Items; !reflect.DeepEqual(job.items(), want) || job.plan.Items != len(want) {
		t.Fatalf("%s: the job's items %+v, the batch's %+v", op, job.items(), want)
	}
}

// asLines is the elements as JSON Lines, one a line; false when an
// element spans lines, which JSON Lines cannot hold.
func asLines(elems []json.RawMessage) ([]byte, bool) {
	var b bytes.Buffer
	for _, e := range elems {
		if bytes.ContainsAny(e, "\r\n") {
			return nil, false
		}
		b.Write(e)
		b.WriteByte('\n')
	}
	return b.Bytes(), true
}

func FuzzStreamArray(f *testing.F) {
	for _, b := range []string{
		`[{"id":"1","a":1},{"id":2}]`, `[{"name":"a"},{"name":"b"}]`, `[]`, `[{}]`, `{}`, `null`, ``, ` `,
		`[1]`, `[[]]`, `[null]`, `[{"id":null}]`, `[{"id":{}}]`, `[{"id":""}]`, `[{"id":"%2e%2e"}]`,
		`[{"id":"7"},{"id":7}]`, `[{"id":1,"id":2}]`, `[{"id":"1"}`, `[{"id":"1"}]]`, `  [ {"id" : "1" } ]  `,
		`[{"id":"1"},{"id":"2"},{"id":"3"},{"id":"4"},{"id":"5"},{"id":"6"},{"id":"7"},{"id":"8"},{"id":"9"}]`,
		"\ufeff[{\"id\":1}]", `[{"id":1} {"id":2}]`, `[{"id":1},]`, `[{"id":1}] x`, "[{\"id\":1,\n\"a\":2}]",
	} {
		f.Add([]byte(b))
	}
	m := fuzzMatch(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, op := range []policy.Op{policy.OpCreate, policy.OpUpdate} {
			job := streamed(m, op, body, "")
			agree(t, op, job, synchronous(m, op, body))
			if job.prob != nil {
				continue
			}
			var elems []json.RawMessage
			if err := json.Unmarshal(body, &elems); err != nil {
				t.Fatalf("admitted a body that is no array: %v", err)
			}
			lines, ok := asLines(elems)
			if !ok {
				continue
			}
			same := streamed(m, op, lines, "application/x-ndjson")
			if same.prob != nil || !reflect.DeepEqual(same.chunks, job.chunks) || !bytes.Equal(same.plan.Digest, job.plan.Digest) {
				t.Fatalf("%s: JSON Lines of the array's elements are another job", op)
			}
		}
	})
}

func FuzzStreamJSONLines(f *testing.F) {
	for _, b := range []string{
		"{\"id\":1}\n{\"id\":2}\n", "{\"name\":\"a\"}", "\n\n{\"id\":1}\r\n\r\n", "{\"id\":1}\n{\"id\":1}\n",
		"{\"id\":1} {\"id\":2}\n", "[{\"id\":1}]\n", "{\"id\":1},\n{\"id\":2}", "{\"id\":\n1}\n", "\u00a0{\"id\":1}",
		" \t\r\n", "", "null\n", "{\"id\":\"..\"}\n", "{\"id\":1.5}\n", "{\"id\":1}\r\r\n", "\r{\"id\":1}",
		"{\"id\":1}\n{\"id\":2}\n{\"id\":3}\n{\"id\":4}\n{\"id\":5}\n{\"id\":6}\n{\"id\":7}\n{\"id\":8}\n{\"id\":9}\n",
	} {
		f.Add([]byte(b))
	}
	m := fuzzMatch(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		var elems [][]byte
		valid := true
		for line := range bytes.SplitSeq(body, []byte("\n")) {
			elem := bytes.Trim(bytes.TrimSuffix(line, []byte("\r")), jsonSpace)
			if len(elem) == 0 {
				continue
			}
			valid = valid && json.Valid(elem)
			elems = append(elems, elem)
		}
		array := append(append([]byte("["), bytes.Join(elems, []byte(","))...), ']')
		for _, op := range []policy.Op{policy.OpCreate, policy.OpUpdate} {
			job := streamed(m, op, body, "application/x-ndjson")
			if !valid {
				if job.prob == nil {
					t.Fatalf("%s: admitted JSON Lines with a line that is not one JSON value", op)
				}
				checkProblem(t, job.prob.Status)
				continue
			}
			if len(array) > int(m.Resource.Settings.MaxBodySize) || len(body) > int(m.Resource.Settings.MaxBodySize) {
				continue // the two bodies' sizes differ: max_body_size would not judge them alike
			}
			agree(t, op, job, synchronous(m, op, array))
		}
	})
}
