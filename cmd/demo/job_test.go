package main

import (
	"encoding/json"
	"regexp"
	"strings"
)

// jobPlaceholders are what the tour's bulk job writes in place of what
// changes from run to run: <job> and <token>, the job's id and token,
// learnt from the answer that shows them first ("id":"<job>",
// "token":"<token>") and written into every later command and output;
// and "<time>", "<state>" and "<done>", a JSON value the document leaves
// open (a time, the state a job was in when it was answered, its counts
// then).
type jobPlaceholders struct {
	id, token string
}

var openValues = map[string]bool{"<time>": true, "<state>": true, "<done>": true}

// learn takes the job's id and token from an answer whose document
// shows them as placeholders.
func (j *jobPlaceholders) learn(want string, body []byte) {
	if !strings.Contains(want, `"id":"<job>"`) && !strings.Contains(want, `"token":"<token>"`) {
		return
	}
	var status struct{ ID, Token string }
	if json.Unmarshal(body, &status) != nil {
		return
	}
	if strings.Contains(want, `"id":"<job>"`) {
		j.id = status.ID
	}
	if strings.Contains(want, `"token":"<token>"`) {
		j.token = status.Token
	}
}

// expand writes the job's id and token in place of their placeholders,
// once they are known.
func (j *jobPlaceholders) expand(s string) string {
	if j.id != "" {
		s = strings.ReplaceAll(s, "<job>", j.id)
	}
	if j.token != "" {
		s = strings.ReplaceAll(s, "<token>", j.token)
	}
	return s
}

// wildcards returns got with each value the document leaves open (an
// openValues string in want) replaced by want's, so that a deep
// comparison passes over them; a member left open that got lacks (a
// job queued has no start yet) is put in too.
func wildcards(got, want any) any {
	switch w := want.(type) {
	case string:
		if openValues[w] {
			return w
		}
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return got
		}
		out := make(map[string]any, len(g))
		for k, v := range g {
			out[k] = v
			if wv, ok := w[k]; ok {
				out[k] = wildcards(v, wv)
			}
		}
		for k, wv := range w {
			if s, ok := wv.(string); ok && s == "<time>" {
				if _, ok := out[k]; !ok {
					out[k] = s
				}
			}
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return got
		}
		out := make([]any, len(g))
		for i := range g {
			out[i] = wildcards(g[i], w[i])
		}
		return out
	}
	return got
}

// jobStates are the states of a job that has not ended.
var jobStates = regexp.MustCompile(`"state":"(queued|running|cancelling)"`)

// watchesJob says the step reads a job's status, which the tour reads
// until the job has ended.
func (s step) watchesJob() bool {
	command, _ := s.piped()
	return strings.Contains(command, "/api/jobs/") && !strings.Contains(command, "/results") && !strings.Contains(command, "-X ")
}

// jobRunning says a status answer is of a job not ended yet.
func jobRunning(body []byte) bool {
	return jobStates.Match(body)
}
