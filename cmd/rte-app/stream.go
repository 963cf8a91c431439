package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// Server-Sent Events of GET /api/v2/jobs/{id}/stream:
//
//	id: <seq>            event: record   data: <the record as GET .../records gives it>
//	                     event: job      data: <the job>, once, last: the job has ended
//
// A client that loses the stream reconnects with Last-Event-ID (or ?after=) set to the last
// seq it saw and misses nothing. Comment lines (": keepalive") keep quiet streams open.
const (
	sseRecord = "record"
	sseJob    = "job"
)

// stream sends the job's stored records as they arrive, from after Last-Event-ID, and ends
// with the job once it has ended and every record up to its end was sent.
func (h *api) stream(w http.ResponseWriter, r *http.Request) {
	j, ok := h.findJob(w, r)
	if !ok {
		return
	}
	after, ok := resumePoint(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	rc := http.NewResponseController(w)
	// The server's ReadTimeout also covers the connection's background read, and its expiry
	// would cancel ctx in the middle of a long job: a stream has read its request, so clear it.
	_ = rc.SetReadDeadline(time.Time{})
	// Subscribe before the first read, so a record stored between the read and the wait
	// still wakes this stream.
	changed, stop := h.app.Watch(j.ID)
	defer stop()

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no") // nginx: pass events on as they come
	w.WriteHeader(http.StatusOK)
	out := bufio.NewWriterSize(w, 64<<10)
	send := func() bool {
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		return out.Flush() == nil && rc.Flush() == nil
	}
	fmt.Fprintf(out, "retry: 2000\n\n")
	if !send() {
		return
	}
	keepalive := time.NewTicker(streamKeepalive)
	defer keepalive.Stop()
	log := h.log.With(zap.String("job", j.ID))
	ended := false // the end record was sent
	for {
		recs, err := h.app.Records(ctx, j.ID, after, streamPage)
		if err != nil {
			if ctx.Err() == nil {
				log.Error("stream: read records failed", zap.Error(err))
			}
			return
		}
		for _, rec := range recs {
			writeEvent(out, strconv.FormatInt(rec.Seq, 10), sseRecord, rec)
			after = rec.Seq
			ended = ended || rec.Kind == protocol.KindEnd
		}
		if len(recs) > 0 && !send() {
			return
		}
		if len(recs) == streamPage {
			continue
		}
		// The job's state says when the stream is over: after its end record, or, for a job
		// the app ended itself (queue timeout, canceled while queued), once every stored
		// record was sent, since such a job has no end record.
		cur, err := h.app.GetJob(ctx, j.ID)
		if err != nil {
			if ctx.Err() == nil {
				log.Error("stream: read job failed", zap.Error(err))
			}
			return
		}
		if ended || cur.State == app.JobEnded {
			if cur.LastSeq > after {
				continue
			}
			writeEvent(out, "", sseJob, newJobView(cur))
			send()
			return
		}
		select {
		case <-changed:
		case <-keepalive.C:
			fmt.Fprint(out, ": keepalive\n\n")
			if !send() {
				return
			}
		case <-ctx.Done():
			return
		case <-h.closing:
			return
		}
	}
}

// resumePoint is the seq after which a stream starts: Last-Event-ID, else ?after=, else 0.
func resumePoint(w http.ResponseWriter, r *http.Request) (int64, bool) {
	name, s := "Last-Event-ID", r.Header.Get("Last-Event-ID")
	if s == "" {
		name, s = "after", r.URL.Query().Get("after")
	}
	if s == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		writeError(w, http.StatusBadRequest, "%s: %s is not a record seq (a whole number, 0 or more)", name, quote(s))
		return 0, false
	}
	return n, true
}

// writeEvent writes one event. JSON from encoding/json has no raw newlines; the split is
// there so a value that had one would still be one event.
func writeEvent(w io.Writer, id, name string, v any) {
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

// sseEvent is one event as a client reads it.
type sseEvent struct {
	ID, Name string
	Data     []byte
}

// maxEventBytes bounds one event a client reads: an events record of a big inventory can be
// a few MiB, and nothing legitimate comes near the protocol's 16 MiB message.
const maxEventBytes = protocol.MaxMessageBytes + 1<<20

// sseReader reads events from a stream.
type sseReader struct {
	r *bufio.Reader
}

func newSSEReader(r io.Reader) *sseReader { return &sseReader{r: bufio.NewReaderSize(r, 64<<10)} }

// Next returns the next event, skipping comments and retry lines; io.EOF at a clean end.
func (s *sseReader) Next() (sseEvent, error) {
	var ev sseEvent
	var data [][]byte
	size, seen := 0, false
	for {
		line, err := s.readLine(maxEventBytes - size)
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
func (s *sseReader) readLine(limit int) ([]byte, error) {
	var line []byte
	for {
		chunk, isPrefix, err := s.r.ReadLine()
		if err != nil {
			return nil, err
		}
		line = append(line, chunk...)
		if len(line) > limit {
			return nil, fmt.Errorf("an event of the stream is larger than %d bytes", maxEventBytes)
		}
		if !isPrefix {
			return line, nil
		}
	}
}

// isStream reports whether an answer is an event stream rather than a JSON error.
func isStream(resp *http.Response) bool {
	return strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
}
