package api

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/internal/refapp/sse"
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
	EventRecord = "record" // a record, as GET .../records gives it
	EventJob    = "job"    // the job, once, last: the job has ended
)

// Stream sends the job's stored records as they arrive, from after Last-Event-ID, and ends
// with the job once it has ended and every record up to its end was sent.
func (h *API) Stream(w http.ResponseWriter, r *http.Request) {
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
	keepalive := time.NewTicker(StreamKeepalive)
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
			sse.WriteEvent(out, strconv.FormatInt(rec.Seq, 10), EventRecord, rec)
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
			sse.WriteEvent(out, "", EventJob, NewJobView(cur))
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
		writeError(w, http.StatusBadRequest, "%s: %s is not a record seq (a whole number, 0 or more)", name, config.Quote(s))
		return 0, false
	}
	return n, true
}
