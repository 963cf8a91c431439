package session_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/session"
)

// fakeChecker answers every target "connected", after release is closed (nil: at once), or
// "timeout" when its context ends first. It counts the checks running and notes the
// cancelled ones.
type fakeChecker struct {
	release chan struct{}

	mu        sync.Mutex
	running   int
	started   chan string // check ids, as they start
	cancelled []string
}

func newChecker(block bool) *fakeChecker {
	f := &fakeChecker{started: make(chan string, 100)}
	if block {
		f.release = make(chan struct{})
	}
	return f
}

func (f *fakeChecker) Run(ctx context.Context, c *protocol.Check) protocol.CheckResult {
	f.mu.Lock()
	f.running++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running--
		f.mu.Unlock()
	}()
	f.started <- c.ID
	status := protocol.CheckConnected
	if f.release != nil {
		select {
		case <-f.release:
		case <-ctx.Done():
			status = protocol.CheckTimeout
			f.mu.Lock()
			f.cancelled = append(f.cancelled, c.ID)
			f.mu.Unlock()
		}
	}
	res := protocol.CheckResult{ID: c.ID, Results: make([]protocol.CheckOutcome, len(c.Targets))}
	for i, t := range c.Targets {
		res.Results[i] = protocol.CheckOutcome{Name: t.Name, Host: t.Host, Status: status, Message: "fake", LatencyMS: 1}
	}
	return res
}

func (f *fakeChecker) waitStarted(t *testing.T, want string) {
	t.Helper()
	select {
	case id := <-f.started:
		if id != want {
			t.Fatalf("checker started check %q, want %q", id, want)
		}
	case <-time.After(waitLimit):
		t.Fatalf("checker never started check %q", want)
	}
}

func checkOf(id string, hosts ...string) *protocol.Check {
	c := &protocol.Check{ID: id, TimeoutMS: 1000, Targets: []protocol.CheckTarget{}}
	for i, h := range hosts {
		c.Targets = append(c.Targets, protocol.CheckTarget{Name: fmt.Sprintf("n%d", i), Host: h, Transport: protocol.TransportSSH})
	}
	return c
}

// expectResult reads the next message and wants the check.result of id with one connected
// outcome per host, in order.
func expectResult(a *app, id string, hosts ...string) {
	a.t.Helper()
	res := expect[*protocol.CheckResult](a)
	if res.ID != id || len(res.Results) != len(hosts) {
		a.t.Fatalf("check.result %+v, want id %q with %d outcomes", *res, id, len(hosts))
	}
	for i, h := range hosts {
		if o := res.Results[i]; o.Host != h || o.Name != fmt.Sprintf("n%d", i) || o.Status != protocol.CheckConnected {
			a.t.Fatalf("outcome %d of %s: %+v, want host %q name n%d connected", i, id, o, h, i)
		}
	}
}

func TestCheckAnswered(t *testing.T) {
	ch := newChecker(false)
	// A full RTE answers checks: they are not jobs.
	jobs := newJobs(1, "busy-job")
	r := newRig(t, session.Config{Jobs: jobs, Checker: ch})
	a := r.dial(t)
	a.handshake(approved)
	a.send(checkOf("c1", "10.0.0.1", "web02.example.com"))
	expectResult(a, "c1", "10.0.0.1", "web02.example.com")
	a.send(checkOf("c-empty"))
	expectResult(a, "c-empty")
	jobs.mu.Lock()
	started := len(jobs.started)
	jobs.mu.Unlock()
	if started != 0 {
		t.Fatalf("a check started %d jobs, want none", started)
	}
}

func TestCheckRefusals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		checker session.Checker
		welcome *protocol.Welcome
		says    string
	}{
		{"no checker", nil, &approved, "does not handle connection checks"},
		{"before welcome", newChecker(false), nil, "no welcome on this socket yet"},
		{"not approved", newChecker(false), &protocol.Welcome{Protocol: protocol.Version, Node: "app-1"}, "not approved"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, session.Config{Checker: tc.checker})
			a := r.dial(t)
			if tc.welcome != nil {
				a.handshake(*tc.welcome)
			} else {
				expect[*protocol.Hello](a)
			}
			a.send(checkOf("c1", "h"))
			e := expect[*protocol.Error](a)
			if e.Code != protocol.ErrUnexpected || e.Ref != "c1" || !strings.Contains(e.Message, tc.says) {
				t.Fatalf("answer to a check %s: %+v, want code %q ref c1 saying %q", tc.name, *e, protocol.ErrUnexpected, tc.says)
			}
		})
	}
}

// TestCheckBoundedAndOffTheReader holds DefaultMaxChecks checks running: one more is refused
// at once, an ack sent meanwhile is applied, and once they answer a new check runs again.
func TestCheckBoundedAndOffTheReader(t *testing.T) {
	out := newOutbox()
	out.add("j1", "x")
	ch := newChecker(true)
	r := newRig(t, session.Config{Jobs: newJobs(7), Outbox: out, Checker: ch})
	a := r.dial(t)
	a.handshake(approved)
	if got := fmt.Sprint(recordsOf(a, 1)); got != "[j1/1]" {
		t.Fatalf("records after welcome: %s, want [j1/1]", got)
	}

	var ids []string
	for i := range session.DefaultMaxChecks {
		id := fmt.Sprintf("slow-%d", i)
		ids = append(ids, id)
		a.send(checkOf(id, "h"))
		ch.waitStarted(t, id)
	}
	a.send(checkOf("one-too-many", "h"))
	e := expect[*protocol.Error](a)
	if e.Ref != "one-too-many" || !strings.Contains(e.Message, "already running") {
		t.Fatalf("answer to a check beyond the bound: %+v, want an error for one-too-many saying checks are already running", *e)
	}

	// The reader is free while the checks run: an ack is applied and a job.start answered.
	a.send(&protocol.Ack{Job: "j1", Seq: 1})
	expectAck(t, out, protocol.Ack{Job: "j1", Seq: 1})
	a.send(&protocol.JobStart{Job: "during-checks", Playbook: "site.yml"})
	if acc := expect[*protocol.JobAccepted](a); acc.Job != "during-checks" {
		t.Fatalf("job.accepted for %q, want during-checks", acc.Job)
	}

	close(ch.release)
	answered := map[string]bool{}
	for range ids {
		res := expect[*protocol.CheckResult](a)
		answered[res.ID] = true
	}
	for _, id := range ids {
		if !answered[id] {
			t.Fatalf("check %s got no check.result; answered %v", id, answered)
		}
	}
	// The slots are free again (each is released just after its result is queued).
	eventually(t, "every check slot free", func() bool {
		a.send(checkOf("after", "h"))
		m := a.next(true)
		if res, ok := m.(*protocol.CheckResult); ok && res.ID == "after" {
			return true
		}
		if e, ok := m.(*protocol.Error); ok && strings.Contains(e.Message, "already running") {
			return false
		}
		t.Fatalf("answer to a check after the others answered: %T %+v", m, m)
		return false
	})
}

// TestCheckEndsWithTheSocket closes the socket while a check runs: the session cancels it and
// waits for it (goleak would see a goroutine left behind).
func TestCheckEndsWithTheSocket(t *testing.T) {
	ch := newChecker(true)
	r := newRig(t, session.Config{Checker: ch})
	a := r.dial(t)
	a.handshake(approved)
	a.send(checkOf("c1", "h"))
	ch.waitStarted(t, "c1")
	_ = a.ws.Close()
	eventually(t, "the check cancelled", func() bool {
		ch.mu.Lock()
		defer ch.mu.Unlock()
		return len(ch.cancelled) == 1 && ch.running == 0
	})
	eventually(t, "disconnected", func() bool { return !r.m.Connected() })
}
