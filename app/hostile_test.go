package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// The tests of this file send the inputs of issue 10 to the real app half over real sockets:
// a flood of records on the outbound endpoint, messages from a runner nobody approved,
// answers that named fingerprints, and the waiting slots.

func strayRecord(job string) *protocol.Record {
	return &protocol.Record{Job: job, Seq: 1, Kind: protocol.KindOutput, At: time.Now().UTC(),
		Data: json.RawMessage(`{"text":"flood"}`)}
}

// readUntilClosed reads frames until the app closes the socket, counting the error messages.
func readUntilClosed(t *testing.T, o *outRTE) (errs int, ce *websocket.CloseError) {
	t.Helper()
	_ = o.ws.SetReadDeadline(time.Now().Add(waitLimit))
	for {
		_, data, err := o.ws.ReadMessage()
		if err != nil {
			if !errors.As(err, &ce) {
				t.Fatalf("RTE read: %v, want a close frame from the app", err)
			}
			return errs, ce
		}
		if m := decodeFrame(t, data); m.Type() == protocol.TypeError {
			errs++
		}
	}
}

// TestOutboundFloodOfStrayRecords: an approved runner sending records of jobs the app never
// gave it gets each refused as a bad message and is closed with 1008 past the budget; nothing
// is stored, and the log says it a sampled handful of times, not once per record.
func TestOutboundFloodOfStrayRecords(t *testing.T) {
	ctx := context.Background()
	ta := newTestApp(t, nil)
	ta.start(t)
	o := joinOut(t, ta, "flooder", testToken, testJoin)
	if w := want[*protocol.Welcome](o); !w.Approved {
		t.Fatalf("welcome %+v, want approved (join token)", w)
	}
	const sent = protocol.MaxBadMessages + 50
	go func() {
		for i := range sent {
			b, _ := protocol.Encode(strayRecord(fmt.Sprintf("stray-%d", i)))
			if o.ws.WriteMessage(websocket.TextMessage, b) != nil {
				return // closed by the app, as wanted
			}
		}
	}()
	errs, ce := readUntilClosed(t, o)
	if ce.Code != protocol.ClosePolicyViolation || !strings.Contains(ce.Text, "bad messages") {
		t.Fatalf("closed with %d %q, want %d after too many bad messages", ce.Code, ce.Text, protocol.ClosePolicyViolation)
	}
	// The close frame may overtake errors still queued (socket.Conn.Close writes beside the
	// writer), so only the upper bound is certain.
	if errs > protocol.MaxBadMessages {
		t.Fatalf("%d error messages before the close, want at most %d", errs, protocol.MaxBadMessages)
	}
	n := ta.logs.FilterMessage("runner sent records of a job the app did not give it; they are not stored or acked").Len()
	if n < 1 || n > 10 {
		t.Fatalf("%d warning lines for %d stray records, want 1 to 10 (sampled)", n, sent)
	}
	t.Logf("%d stray records sent: %d errors read before the close, %d warning lines, closed %d %q", sent, errs, n, ce.Code, ce.Text)
	jobs, err := ta.store.ListJobs(ctx, app.JobFilter{})
	if err != nil || len(jobs) != 0 {
		t.Fatalf("the store holds %d jobs (%v) after the flood, want none", len(jobs), err)
	}
	if r := ta.runner(t, "flooder"); r.State != app.StateApproved {
		t.Fatalf("runner is %s after the flood, want it kept approved", r.State)
	}
}

// TestOutboundUnapprovedSendsOnlyCapacity: a runner waiting for approval may send capacity;
// anything else is a bad message answered with the reason, and a flood of them closes 1008.
func TestOutboundUnapprovedSendsOnlyCapacity(t *testing.T) {
	ta := newTestApp(t, nil)
	ta.start(t)
	o := joinOut(t, ta, "stranger", "stranger-token-0123456789", "")
	if w := want[*protocol.Welcome](o); w.Approved {
		t.Fatalf("welcome %+v, want approved false", w)
	}
	o.send(&protocol.Capacity{Running: 0, MaxJobs: 2})
	o.send(&protocol.JobAccepted{Job: "never-given"})
	e := want[*protocol.Error](o)
	if e.Code != protocol.ErrUnexpected || e.Ref != "never-given" || !strings.Contains(e.Message, `job.accepted: runner "stranger" is not approved yet`) {
		t.Fatalf("answer to job.accepted from a waiting runner: %+v, want unexpected naming the approval", e)
	}
	go func() {
		for i := range protocol.MaxBadMessages + 20 {
			b, _ := protocol.Encode(strayRecord(fmt.Sprintf("s-%d", i)))
			if o.ws.WriteMessage(websocket.TextMessage, b) != nil {
				return
			}
		}
	}()
	if _, ce := readUntilClosed(t, o); ce.Code != protocol.ClosePolicyViolation {
		t.Fatalf("closed with %d %q, want %d", ce.Code, ce.Text, protocol.ClosePolicyViolation)
	}
	if n := ta.logs.FilterMessage("unapproved runner sent a message it may not send yet").Len(); n < 1 || n > 10 {
		t.Fatalf("%d warning lines, want 1 to 10 (sampled)", n)
	}
	if r := ta.runner(t, "stranger"); r.State != app.StateWaiting {
		t.Fatalf("runner is %s, want still waiting", r.State)
	}
}

// TestOutboundRefusalsNameNoFingerprint: the 401 for a known name with a wrong token says what
// is wrong without the approved runner's token fingerprint.
func TestOutboundRefusalsNameNoFingerprint(t *testing.T) {
	ta := newTestApp(t, nil)
	ta.start(t)
	want[*protocol.Welcome](joinOut(t, ta, "taken", testToken, testJoin))
	fp := protocol.TokenFingerprint(testToken)
	for _, join := range []string{"", testJoin} {
		_, resp, err := dialOut(t, ta, "taken", "wrong-token-0123456789abcdef", join)
		if err == nil {
			t.Fatal("the app took a socket with the wrong token")
		}
		status, msg := refusal(t, resp)
		if (status != http.StatusUnauthorized && status != http.StatusForbidden) || !strings.Contains(msg, "taken") || strings.Contains(msg, fp) {
			t.Fatalf("join %q: %d %q, want 401/403 naming the runner and not the fingerprint %s", join, status, msg, fp)
		}
	}
}

// TestWaitingSlotsPerAddressAndClear: one address cannot take every waiting slot, and an admin
// clears waiting requests at once: their sockets hear rejected and close 4003; approved
// runners stay; the slots are free again.
func TestWaitingSlotsPerAddressAndClear(t *testing.T) {
	ctx := context.Background()
	ta := newTestApp(t, func(c *app.Config) { c.MaxWaitingPerAddress = 2 })
	ta.start(t)
	want[*protocol.Welcome](joinOut(t, ta, "approved", testToken, testJoin))
	var waiting []*outRTE
	for _, n := range []string{"w1", "w2"} {
		o := joinOut(t, ta, n, n+"-token-0123456789abcd", "")
		want[*protocol.Welcome](o)
		waiting = append(waiting, o)
	}
	_, resp, err := dialOut(t, ta, "w3", "w3-token-0123456789abcd", "")
	if err == nil {
		t.Fatal("a third waiting socket from one address was taken")
	}
	if status, msg := refusal(t, resp); status != http.StatusTooManyRequests || !strings.Contains(msg, "from this address") {
		t.Fatalf("third waiting runner: %d %q, want 429 naming the per-address bound", status, msg)
	}
	ta.waitLive(t, "w1", true)
	ta.waitLive(t, "w2", true)
	names, err := ta.ClearWaiting(ctx, "cleared by test")
	slices.Sort(names)
	if err != nil || !slices.Equal(names, []string{"w1", "w2"}) {
		t.Fatalf("ClearWaiting = %v, %v; want w1 and w2", names, err)
	}
	for _, o := range waiting {
		if rj := want[*protocol.Rejected](o); !strings.Contains(rj.Reason, "cleared by test") {
			t.Fatalf("%s heard %+v, want rejected with the reason", o.name, rj)
		}
		if ce := o.closed(); ce.Code != protocol.CloseRejected {
			t.Fatalf("%s closed with %d, want %d", o.name, ce.Code, protocol.CloseRejected)
		}
	}
	if n := runnerCount(t, ta); n != 1 || ta.runner(t, "approved").State != app.StateApproved {
		t.Fatalf("%d runners after the clear, want only the approved one kept", n)
	}
	want[*protocol.Welcome](joinOut(t, ta, "w3", "w3-token-0123456789abcd", ""))
}
