package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"sync"
	"unicode/utf8"
)

// answerHead is the answer's members before its items.
type answerHead struct {
	Atomicity string  `json:"atomicity"`
	Outcome   Outcome `json:"outcome"`
	Succeeded int     `json:"succeeded"`
	Failed    int     `json:"failed"`
	// Saga names the saga whose lease this gateway lost, so that its
	// client can look its outcome up (docs/durability.md, "A saga never writes after it lost its lease").
	Saga string `json:"saga,omitempty"`
}

// itemTail is an ItemResult's members after its body, with the same
// names, order and omissions; appendItemHead writes the ones before it.
// TestAnswerAsMarshalled holds both to ItemResult.
type itemTail struct {
	BodyText     string            `json:"body_text,omitempty"`
	Headers      map[string]string `json:"headers,omitempty"`
	Error        string            `json:"error,omitempty"`
	Compensation *Compensation     `json:"compensation,omitempty"`
}

// answerWriters buffer the writes of an answer: three or four small ones
// per item would otherwise each go through every writer Caddy wraps the
// client's in. A body larger than what is buffered goes straight through.
var answerWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 32<<10) }}

// writeAnswer writes {head…, "items": [items…]} to w: what
// json.Encoder would make of it, except that each item's body is copied
// as it is, never validated or compacted again. setResponse let in only
// bodies that are valid JSON and valid UTF-8, and encoding/json would
// only have taken out the whitespace between their tokens, at the cost
// of a second copy of every body. HTML characters stay unescaped, as
// problem.Details.Write leaves them.
func writeAnswer(w io.Writer, head any, items []ItemResult) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(head); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - len("}\n"))
	buf.WriteString(`,"items":[`)
	// One for the whole answer: a value passed to Encode as an interface
	// would be allocated for every item.
	var tl itemTail
	for i := range items {
		it := &items[i]
		if i > 0 {
			buf.WriteByte(',')
		}
		// The members every item has are written by hand: encoding/json's
		// reflection, twice per item (the answer is counted, then
		// written), cost more than the rest of the answer together.
		buf.Write(appendItemHead(buf.AvailableBuffer(), it))
		if len(it.Body) > 0 {
			buf.WriteString(`,"body":`)
			if _, err := w.Write(buf.Bytes()); err != nil {
				return err
			}
			buf.Reset()
			if _, err := w.Write(it.Body); err != nil {
				return err
			}
		}
		if it.BodyText == "" && len(it.Headers) == 0 && it.Error == "" && it.Compensation == nil {
			buf.WriteByte('}')
		} else {
			mark := buf.Len()
			tl = itemTail{BodyText: it.BodyText, Headers: it.Headers, Error: it.Error, Compensation: it.Compensation}
			if err := enc.Encode(&tl); err != nil {
				return err
			}
			// {"body_text":…}\n continues the item: ,"body_text":…}
			buf.Bytes()[mark] = ','
			buf.Truncate(buf.Len() - len("\n"))
		}
		// Small items go out together, not one write each.
		if buf.Len() >= 4<<10 {
			if _, err := w.Write(buf.Bytes()); err != nil {
				return err
			}
			buf.Reset()
		}
	}
	buf.WriteString("]}\n") // the newline json.Encoder ends with, as before
	_, err := w.Write(buf.Bytes())
	return err
}

// appendItemHead appends an item's members before its body, as
// encoding/json would: {"index":…,"id":…,"status":…,"outcome":…
// with id and status left out when empty.
func appendItemHead(b []byte, it *ItemResult) []byte {
	b = append(b, `{"index":`...)
	b = strconv.AppendInt(b, int64(it.Index), 10)
	if it.OperationID != "" {
		b = append(b, `,"op":`...)
		b = appendJSONString(b, it.OperationID)
	}
	if it.Method != "" {
		b = append(b, `,"method":`...)
		b = appendJSONString(b, it.Method)
	}
	if it.URL != "" {
		b = append(b, `,"url":`...)
		b = appendJSONString(b, it.URL)
	}
	if it.ID != "" {
		b = append(b, `,"id":`...)
		b = appendJSONString(b, it.ID)
	}
	if it.Status != 0 {
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(it.Status), 10)
	}
	b = append(b, `,"outcome":`...)
	return appendJSONString(b, string(it.Outcome))
}

// appendJSONString appends s as a JSON string, as encoding/json does with
// HTML escaping off. Ids and outcomes are nearly always plain ASCII,
// which needs no escaping; anything else is left to encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			var quoted bytes.Buffer
			enc := json.NewEncoder(&quoted)
			enc.SetEscapeHTML(false)
			_ = enc.Encode(s) // a string always encodes
			return append(b, bytes.TrimSuffix(quoted.Bytes(), []byte("\n"))...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// byteCounter counts what is written to it, and keeps none of it.
type byteCounter int64

func (c *byteCounter) Write(p []byte) (int, error) {
	*c += byteCounter(len(p))
	return len(p), nil
}
