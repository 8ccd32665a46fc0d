package durable

import (
	"bytes"
	"net/http"
	"strconv"
)

// AnswerRecorder is an http.ResponseWriter that keeps a batch's answer,
// so that it is stored before the client gets it.
type AnswerRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

// NewAnswerRecorder is an empty recorder.
func NewAnswerRecorder() *AnswerRecorder { return &AnswerRecorder{header: http.Header{}} }

// Header is the answer's header.
func (a *AnswerRecorder) Header() http.Header { return a.header }

// WriteHeader keeps the first status written.
func (a *AnswerRecorder) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

// Write keeps b in the body.
func (a *AnswerRecorder) Write(b []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	return a.body.Write(b)
}

// Answer is what was written.
func (a *AnswerRecorder) Answer() *Answer {
	h := a.header.Clone()
	h.Del("Content-Length") // set again from the body on every answer
	return &Answer{Status: a.status, Header: h, Body: a.body.Bytes()}
}

// Write sends the answer, adding its headers to those already set on w.
func (a *Answer) Write(w http.ResponseWriter) error {
	h := w.Header()
	for name, values := range a.Header {
		h[name] = values
	}
	h.Set("Content-Length", strconv.Itoa(len(a.Body)))
	status := a.Status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, err := w.Write(a.Body)
	return err
}
