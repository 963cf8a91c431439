package app_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// checkCall is one App.Check running in the background.
type checkCall struct {
	res protocol.CheckResult
	err error
	end chan struct{}
}

func startCheck(ta *testApp, runner string, targets []protocol.CheckTarget, timeout time.Duration) *checkCall {
	c := &checkCall{end: make(chan struct{})}
	go func() {
		defer close(c.end)
		c.res, c.err = ta.Check(context.Background(), runner, targets, timeout)
	}()
	return c
}

func (c *checkCall) wait(t *testing.T) (protocol.CheckResult, error) {
	t.Helper()
	select {
	case <-c.end:
		return c.res, c.err
	case <-time.After(waitLimit):
		t.Fatalf("Check did not return within %s", waitLimit)
		return protocol.CheckResult{}, nil
	}
}

// outcomesFor answers every target of c with status, as an RTE would.
func outcomesFor(c *protocol.Check, status, message string) *protocol.CheckResult {
	res := &protocol.CheckResult{ID: c.ID, Results: []protocol.CheckOutcome{}}
	for _, t := range c.Targets {
		res.Results = append(res.Results, protocol.CheckOutcome{Name: t.Name, Host: t.Host, Status: status, Message: message, LatencyMS: 3})
	}
	return res
}

// checkRunner is an approved outbound runner joined to a running App, driven by the test.
func checkRunner(t *testing.T, ta *testApp, name, token string) *outRTE {
	t.Helper()
	o := joinOut(t, ta, name, token, testJoin)
	if w := want[*protocol.Welcome](o); !w.Approved {
		t.Fatalf("welcome %+v, want approved by the join token", w)
	}
	ta.waitLive(t, name, true)
	return o
}

var twoTargets = []protocol.CheckTarget{
	{Name: "web01", Host: "10.0.4.11", Port: 22, User: "ansible", Transport: protocol.TransportSSH},
	{Name: "win01", Host: "win01.example.com", Transport: protocol.TransportWinRM},
}

func TestCheckRoundTrip(t *testing.T) {
	ta := newTestApp(t, nil)
	ta.start(t)
	o := checkRunner(t, ta, "rte-chk", testToken)

	call := startCheck(ta, "rte-chk", twoTargets, 1500*time.Microsecond)
	c := want[*protocol.Check](o)
	if !strings.HasPrefix(c.ID, "chk-") || c.TimeoutMS != 2 || len(c.Targets) != 2 || c.Targets[0] != twoTargets[0] || c.Targets[1] != twoTargets[1] {
		t.Fatalf("the runner got %+v, want a chk- id, timeout_ms 2 (1.5 ms rounded up) and the two targets as given", *c)
	}
	long := strings.Repeat("é", 3000) // 6000 bytes from a runner that ignores the 512-byte bound
	ans := outcomesFor(c, protocol.CheckConnected, long)
	ans.Results[1].Status = protocol.CheckTimeout
	o.send(ans)
	res, err := call.wait(t)
	if err != nil {
		t.Fatalf("Check: %v, want the runner's answer", err)
	}
	if res.ID != c.ID || len(res.Results) != 2 || res.Results[0].Status != protocol.CheckConnected || res.Results[1].Status != protocol.CheckTimeout ||
		res.Results[0].Name != "web01" || res.Results[1].Host != "win01.example.com" || res.Results[0].LatencyMS != 3 {
		t.Fatalf("Check returned %+v, want the runner's outcomes in the targets' order", res)
	}
	if m := res.Results[0].Message; len(m) > 1100 || !strings.HasPrefix(m, "éé") {
		t.Fatalf("a %d-byte message from the runner came back as %d bytes, want it cut to about 1 KiB", len(long), len(m))
	}

	// Two checks at once on one runner, answered in the other order: each gets its own.
	first := startCheck(ta, "rte-chk", twoTargets[:1], 0)
	c1 := want[*protocol.Check](o)
	second := startCheck(ta, "rte-chk", twoTargets[1:], time.Second)
	c2 := want[*protocol.Check](o)
	if c1.ID == c2.ID || c1.TimeoutMS != 0 || c2.TimeoutMS != 1000 {
		t.Fatalf("checks %q (timeout_ms %d) and %q (%d), want two ids and timeout_ms 0 and 1000", c1.ID, c1.TimeoutMS, c2.ID, c2.TimeoutMS)
	}
	o.send(outcomesFor(c2, protocol.CheckUnreachable, "connection refused"))
	o.send(outcomesFor(c1, protocol.CheckAuthFailed, "no key"))
	if res, err := second.wait(t); err != nil || res.ID != c2.ID || res.Results[0].Status != protocol.CheckUnreachable {
		t.Fatalf("second Check: %+v, %v; want its own answer, unreachable", res, err)
	}
	if res, err := first.wait(t); err != nil || res.ID != c1.ID || res.Results[0].Status != protocol.CheckAuthFailed {
		t.Fatalf("first Check: %+v, %v; want its own answer, auth_failed", res, err)
	}
}

func TestCheckRefusedAndBadAnswers(t *testing.T) {
	ta := newTestApp(t, nil)
	ta.start(t)
	o := checkRunner(t, ta, "rte-chk", testToken)

	for _, tc := range []struct {
		name   string
		answer func(c *protocol.Check) protocol.Message
		is     error
		says   string
	}{
		{"refused", func(c *protocol.Check) protocol.Message {
			return &protocol.Error{Code: protocol.ErrUnexpected, Message: "check: 4 checks are already running on this socket", Ref: c.ID}
		}, app.ErrCheckRefused, "already running"},
		{"too few outcomes", func(c *protocol.Check) protocol.Message {
			res := outcomesFor(c, protocol.CheckConnected, "")
			res.Results = res.Results[:1]
			return res
		}, nil, "1 outcomes for 2 targets"},
		{"outcomes out of order", func(c *protocol.Check) protocol.Message {
			res := outcomesFor(c, protocol.CheckConnected, "")
			res.Results[0], res.Results[1] = res.Results[1], res.Results[0]
			return res
		}, nil, "outcome 0 is for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o.t = t
			call := startCheck(ta, "rte-chk", twoTargets, time.Second)
			c := want[*protocol.Check](o)
			o.send(tc.answer(c))
			_, err := call.wait(t)
			if err == nil || !strings.Contains(err.Error(), tc.says) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("Check: %v, want an error saying %q (wrapping %v)", err, tc.says, tc.is)
			}
		})
	}
	o.t = t
	// An error about something else is not taken for the check's answer.
	call := startCheck(ta, "rte-chk", twoTargets[:1], time.Second)
	c := want[*protocol.Check](o)
	o.send(&protocol.Error{Code: protocol.ErrUnexpected, Message: "about a job", Ref: "job-1"})
	o.send(outcomesFor(c, protocol.CheckConnected, ""))
	if res, err := call.wait(t); err != nil || res.Results[0].Status != protocol.CheckConnected {
		t.Fatalf("Check after an unrelated error: %+v, %v; want the check.result", res, err)
	}
}

func TestCheckRefusedBeforeSending(t *testing.T) {
	ta := newTestApp(t, nil)
	ta.start(t)
	o := checkRunner(t, ta, "rte-chk", testToken)
	for _, tc := range []struct {
		name    string
		runner  string
		targets []protocol.CheckTarget
		timeout time.Duration
		is      error
		says    string
	}{
		{"unknown runner", "nope", twoTargets, time.Second, app.ErrNotConnected, `"nope"`},
		{"empty host", "rte-chk", []protocol.CheckTarget{{Name: "x", Transport: protocol.TransportSSH}}, time.Second, nil, "targets[0].host"},
		{"bad transport", "rte-chk", []protocol.CheckTarget{{Host: "h", Transport: "telnet"}}, time.Second, nil, "targets[0].transport"},
		{"bad port", "rte-chk", []protocol.CheckTarget{{Host: "h", Port: 70000, Transport: protocol.TransportSSH}}, time.Second, nil, "targets[0].port"},
		{"negative timeout", "rte-chk", twoTargets, -time.Second, nil, "must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ta.Check(context.Background(), tc.runner, tc.targets, tc.timeout)
			var fe *protocol.FieldError
			if err == nil || !strings.Contains(err.Error(), tc.says) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("Check: %v, want an error saying %q (wrapping %v)", err, tc.says, tc.is)
			}
			if strings.HasPrefix(tc.says, "targets") && !errors.As(err, &fe) {
				t.Fatalf("Check: %v, want a *protocol.FieldError inside", err)
			}
		})
	}
	// None of these reached the runner: the next message it gets is this check.
	call := startCheck(ta, "rte-chk", twoTargets[:1], time.Second)
	c := want[*protocol.Check](o)
	if len(c.Targets) != 1 || c.Targets[0].Host != twoTargets[0].Host {
		t.Fatalf("the runner got %+v, want the one valid check", *c)
	}
	o.send(outcomesFor(c, protocol.CheckConnected, ""))
	if _, err := call.wait(t); err != nil {
		t.Fatal(err)
	}
}

func TestCheckUnanswered(t *testing.T) {
	defer app.SetCheckAnswerMargin(50 * time.Millisecond)()
	ta := newTestApp(t, nil)
	ta.start(t)
	o := checkRunner(t, ta, "rte-chk", testToken)
	other := checkRunner(t, ta, "rte-other", otherToken)

	// Another runner answers with the check's id: not taken. Then nobody answers in time.
	call := startCheck(ta, "rte-chk", twoTargets[:1], time.Millisecond)
	c := want[*protocol.Check](o)
	other.send(outcomesFor(c, protocol.CheckConnected, "forged"))
	if _, err := call.wait(t); !errors.Is(err, app.ErrCheckUnanswered) || !strings.Contains(err.Error(), "within") {
		t.Fatalf("Check with no answer from its runner: %v, want ErrCheckUnanswered saying within what time", err)
	}
	// A late answer is dropped without harm, and the socket carries on.
	o.send(outcomesFor(c, protocol.CheckConnected, "late"))
	call = startCheck(ta, "rte-chk", twoTargets[:1], time.Second)
	c = want[*protocol.Check](o)
	o.send(outcomesFor(c, protocol.CheckConnected, ""))
	if _, err := call.wait(t); err != nil {
		t.Fatalf("Check after a late answer: %v", err)
	}

	// The socket ends while the check waits: Check returns at once, not after its timeout.
	call = startCheck(ta, "rte-chk", twoTargets[:1], time.Hour)
	want[*protocol.Check](o)
	_ = o.ws.Close()
	if _, err := call.wait(t); !errors.Is(err, app.ErrCheckUnanswered) || !strings.Contains(err.Error(), "socket closed") {
		t.Fatalf("Check whose runner went away: %v, want ErrCheckUnanswered saying the socket closed", err)
	}
	ta.waitLive(t, "rte-chk", false)
	if _, err := ta.Check(context.Background(), "rte-chk", twoTargets, time.Second); !errors.Is(err, app.ErrNotConnected) {
		t.Fatalf("Check of a runner that left: %v, want ErrNotConnected", err)
	}
}
