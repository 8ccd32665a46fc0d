package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"sync"
)

// envelopeHead is the envelope's members before its items.
type envelopeHead struct {
	Atomicity string  `json:"atomicity"`
	Outcome   Outcome `json:"outcome"`
	Succeeded int     `json:"succeeded"`
	Failed    int     `json:"failed"`
}

// itemHead and itemTail are an ItemResult's members before and after its
// body, with the same names, order and omissions: writeEnvelope puts the
// body between them. TestEnvelopeAsMarshalled holds them to ItemResult.
type itemHead struct {
	Index   int     `json:"index"`
	ID      string  `json:"id,omitempty"`
	Status  int     `json:"status,omitempty"`
	Outcome Outcome `json:"outcome"`
}

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

// writeEnvelope writes {head…, "items": [items…]} to w: what
// json.Encoder would make of it, except that each item's body is copied
// as it is, never validated or compacted again. setResponse let in only
// bodies that are valid JSON and valid UTF-8, and encoding/json would
// only have taken out the whitespace between their tokens, at the cost
// of a second copy of every body. HTML characters stay unescaped, as
// problem.WriteJSON leaves them.
func writeEnvelope(w io.Writer, head any, items []ItemResult) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(head); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - len("}\n"))
	buf.WriteString(`,"items":[`)
	// One of each for the whole answer: a value passed to Encode as an
	// interface would be allocated for every item.
	var ih itemHead
	var tl itemTail
	for i := range items {
		it := &items[i]
		if i > 0 {
			buf.WriteByte(',')
		}
		ih = itemHead{Index: it.Index, ID: it.ID, Status: it.Status, Outcome: it.Outcome}
		if err := enc.Encode(&ih); err != nil {
			return err
		}
		buf.Truncate(buf.Len() - len("}\n"))
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
		mark := buf.Len()
		tl = itemTail{BodyText: it.BodyText, Headers: it.Headers, Error: it.Error, Compensation: it.Compensation}
		if err := enc.Encode(&tl); err != nil {
			return err
		}
		if buf.Len()-mark == len("{}\n") {
			buf.Truncate(mark)
			buf.WriteByte('}')
		} else {
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

// byteCounter counts what is written to it, and keeps none of it.
type byteCounter int64

func (c *byteCounter) Write(p []byte) (int, error) {
	*c += byteCounter(len(p))
	return len(p), nil
}
