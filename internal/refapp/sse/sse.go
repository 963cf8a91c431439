package sse

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/rte-project/rte/protocol"
)

// WriteEvent writes one event. JSON from encoding/json has no raw newlines; the split is
// there so a value that had one would still be one event.
func WriteEvent(w io.Writer, id, name string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	if id != "" {
		fmt.Fprintf(w, "id: %s\n", id)
	}
	fmt.Fprintf(w, "event: %s\n", name)
	for _, line := range bytes.Split(b, []byte("\n")) {
		fmt.Fprintf(w, "data: %s\n", line)
	}
	fmt.Fprint(w, "\n")
}

// Event is one event as a client reads it.
type Event struct {
	ID, Name string
	Data     []byte
}

// MaxEventBytes bounds one event a client reads: an events record of a big inventory can be
// a few MiB, and nothing legitimate comes near the protocol's 16 MiB message.
const MaxEventBytes = protocol.MaxMessageBytes + 1<<20

// Reader reads events from a stream, one bounded event at a time.
type Reader struct {
	r *bufio.Reader
}

// NewReader reads events from r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, 64<<10)} }

// Next returns the next event, skipping comments and retry lines; io.EOF at a clean end.
func (s *Reader) Next() (Event, error) {
	var ev Event
	var data [][]byte
	size, seen := 0, false
	for {
		line, err := s.readLine(MaxEventBytes - size)
		if err != nil {
			if errors.Is(err, io.EOF) && seen {
				return ev, io.ErrUnexpectedEOF
			}
			return ev, err
		}
		if len(line) == 0 {
			if !seen {
				continue
			}
			ev.Data = bytes.Join(data, []byte("\n"))
			return ev, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "id":
			ev.ID, seen = string(value), true
		case "event":
			ev.Name, seen = string(value), true
		case "data":
			data = append(data, bytes.Clone(value))
			size += len(value)
			seen = true
		}
	}
}

// readLine reads one line without its ending, refusing one longer than limit.
func (s *Reader) readLine(limit int) ([]byte, error) {
	var line []byte
	for {
		chunk, isPrefix, err := s.r.ReadLine()
		if err != nil {
			return nil, err
		}
		line = append(line, chunk...)
		if len(line) > limit {
			return nil, fmt.Errorf("an event of the stream is larger than %d bytes", MaxEventBytes)
		}
		if !isPrefix {
			return line, nil
		}
	}
}

// IsStream reports whether an answer is an event stream rather than a JSON error.
func IsStream(resp *http.Response) bool {
	return strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
}
