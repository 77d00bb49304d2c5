// Package sse reads a Server-Sent Events stream, for the tests that follow
// dbcloud's event stream as a client would.
package sse

import (
	"bufio"
	"io"
	"strings"
)

// Message is one event of a stream.
type Message struct {
	ID, Event, Data string
}

// Reader reads messages from a stream.
type Reader struct {
	s *bufio.Scanner
}

// NewReader returns a Reader of r.
func NewReader(r io.Reader) *Reader {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	return &Reader{s: s}
}

// Next returns the next message that has data, skipping comments and
// retry hints, or the stream's error (io.EOF at its end).
func (r *Reader) Next() (Message, error) {
	var m Message
	var data []string
	for r.s.Scan() {
		line := r.s.Text()
		if line == "" {
			if len(data) > 0 {
				m.Data = strings.Join(data, "\n")
				return m, nil
			}
			m = Message{}
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			m.ID = value
		case "event":
			m.Event = value
		case "data":
			data = append(data, value)
		}
	}
	if err := r.s.Err(); err != nil {
		return Message{}, err
	}
	return Message{}, io.EOF
}
