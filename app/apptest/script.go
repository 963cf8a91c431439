package apptest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/protocol"
)

// Emit appends a record of kind (protocol.KindOutput, KindEvents, KindEnd, ...) with data to
// the job's spool and sends it when a socket is up, as the RTE does once the record is durable
// in its spool. A record emitted while no socket is up goes out in the next handshake's
// resend. It returns the record as sent. data must marshal to JSON: Emit panics otherwise,
// since that is a mistake in the test, not in the app.
func (r *RTE) Emit(jobID, kind string, data any) protocol.Record {
	raw, err := json.Marshal(data)
	if err != nil {
		panic(fmt.Sprintf("apptest: emit %s for job %s: %v", kind, jobID, err))
	}
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.mu.Lock()
	j := r.jobs[jobID]
	if j == nil {
		j = &job{}
		r.jobs[jobID] = j
	}
	rec := protocol.Record{Job: jobID, Seq: int64(len(j.spool)) + 1, Kind: kind, At: time.Now().UTC(), Data: raw}
	j.spool = append(j.spool, rec)
	if kind == protocol.KindEnd {
		j.ended = true
	}
	ws := r.ws
	r.mu.Unlock()
	if ws != nil {
		_ = r.write(ws, rec)
	}
	return rec
}

// Adopt makes the fake hold jobID as running, with nothing spooled, as an RTE that restarted
// while the job ran: the next hello lists it in running.
func (r *RTE) Adopt(jobID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.jobs[jobID] == nil {
		r.jobs[jobID] = &job{}
	}
}

// Send writes any message on the current socket.
func (r *RTE) Send(m protocol.Message) error {
	b, err := protocol.Encode(m)
	if err != nil {
		return fmt.Errorf("apptest: encode %s: %w", m.Type(), err)
	}
	return r.SendRaw(b)
}

// SendRaw writes one text frame as is on the current socket (the newest in raw mode).
func (r *RTE) SendRaw(frame []byte) error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.mu.Lock()
	ws := r.ws
	r.mu.Unlock()
	if ws == nil {
		return fmt.Errorf("apptest: the fake RTE has no socket to send %.60s on", frame)
	}
	if err := ws.WriteMessage(websocket.TextMessage, frame); err != nil {
		return fmt.Errorf("apptest: send: %w", err)
	}
	return nil
}

// Drop cuts the TCP connection under the current socket, with no close frame: what a network
// failure looks like. Records in flight may or may not have reached the app.
func (r *RTE) Drop() {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ws != nil {
		_ = r.ws.UnderlyingConn().Close()
		r.ws = nil
	}
}

// Acked is the highest seq the app has acknowledged for the job.
func (r *RTE) Acked(jobID string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if j := r.jobs[jobID]; j != nil {
		return j.acked
	}
	return 0
}

// Acks is every ack received for the job, in order.
func (r *RTE) Acks(jobID string) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int64
	for _, a := range r.acks {
		if a.Job == jobID {
			out = append(out, a.Seq)
		}
	}
	return out
}

// Offers is how many job.start messages arrived for the job.
func (r *RTE) Offers(jobID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.offers[jobID]
}

// Secrets is the job's secrets as the fake opened them with the token.
func (r *RTE) Secrets(jobID string) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if j := r.jobs[jobID]; j != nil {
		out := make(map[string]string, len(j.secrets))
		for k, v := range j.secrets {
			out[k] = v
		}
		return out
	}
	return nil
}

// Welcomes is every welcome received, in order.
func (r *RTE) Welcomes() []protocol.Welcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.welcomes)
}

// Resent is how many records went out again because a welcome did not ack them.
func (r *RTE) Resent() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resent
}

// Sockets is how many sockets the app has opened so far.
func (r *RTE) Sockets() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns)
}

// Requests is the headers of every request that reached the fake over HTTP(S).
func (r *RTE) Requests() []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.requests)
}

// Violations is every breach of the protocol the fake saw, in words.
func (r *RTE) Violations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.violations)
}

// NoViolations fails t with every breach of the protocol the fake saw.
func (r *RTE) NoViolations(t testing.TB) {
	t.Helper()
	for _, v := range r.Violations() {
		t.Error(v)
	}
}

// Starts delivers each job the fake accepted, once.
func (r *RTE) Starts() <-chan protocol.JobStart { return r.starts }

// Cancels delivers the job of each job.cancel.
func (r *RTE) Cancels() <-chan string { return r.cancels }

// Errors delivers each error message from the app.
func (r *RTE) Errors() <-chan protocol.Error { return r.errs }

// Refusals delivers each job the fake refused (Config.Refuse).
func (r *RTE) Refusals() <-chan string { return r.refusals }

// Settings delivers each settings message from the app.
func (r *RTE) Settings() <-chan protocol.Settings { return r.settings }

// Welcomed delivers a value at the end of each handshake.
func (r *RTE) Welcomed() <-chan struct{} { return r.welcomed }

// Upgrades delivers a value for each socket upgraded.
func (r *RTE) Upgrades() <-chan struct{} { return r.upgrades }

// Frames delivers each text frame from the app, in raw mode only.
func (r *RTE) Frames() <-chan []byte { return r.frames }

// Closes delivers the code of each close frame from the app, in raw mode only.
func (r *RTE) Closes() <-chan int { return r.closes }

// String names the fake in a failure message.
func (r *RTE) String() string { return fmt.Sprintf("fake RTE %s at %s", r.cfg.Name, r.Addr()) }
