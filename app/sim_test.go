package app_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/apptest"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// waitLimit is the safety net of every wait in these tests, not a measurement.
const waitLimit = 15 * time.Second

// simRTE is the fake RTE of package apptest, the one app authors get, over real TLS with the
// test's certificate: it keeps a spool per job, says what it holds in its hello, resends what
// the welcome does not ack, answers job.start (accepting a job it already has again, never
// starting it twice), and records every ack. Records are made by the test with Emit.
type simRTE struct {
	*apptest.RTE
	name  string
	token string
	cert  testCert

	// refuse, when set, decides a new job's fate: a refusal code, or "" to accept it.
	refuse func(start protocol.JobStart) string
	// checkAck, when set, is called for every ack as it arrives; an error it returns is kept
	// as a violation.
	checkAck func(protocol.Ack) error
}

// startSim starts a sim named name offering maxJobs slots, with the test's token unless an
// edit changes it.
func startSim(t testing.TB, name string, maxJobs int, edits ...func(*apptest.Config)) *simRTE {
	t.Helper()
	s := &simRTE{name: name, cert: newCert(t)}
	cfg := apptest.Config{
		Name: name, Token: testToken, MaxJobs: maxJobs, Certificate: &s.cert.tls,
		Refuse: func(start protocol.JobStart) *protocol.JobRefused {
			if s.refuse == nil {
				return nil
			}
			if code := s.refuse(start); code != "" {
				return &protocol.JobRefused{Job: start.Job, Code: code, Message: "the sim refuses: " + code}
			}
			return nil
		},
		CheckAck: func(a protocol.Ack) error {
			if s.checkAck == nil {
				return nil
			}
			return s.checkAck(a)
		},
	}
	for _, edit := range edits {
		edit(&cfg)
	}
	s.token = cfg.Token
	s.RTE = apptest.Start(t, cfg)
	return s
}

func (s *simRTE) url() string { return s.URL() }

func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLimit):
		t.Fatalf("no %s within %s", what, waitLimit)
		var zero T
		return zero
	}
}

// runningApp is a testApp whose Run is going, on the given store, with fast timing knobs.
func runningApp(t *testing.T, store app.Store, edit func(*app.Config)) *testApp {
	t.Helper()
	ta := newTestApp(t, func(c *app.Config) {
		c.Store = store
		c.PollInterval = 20 * time.Millisecond
		c.RedialMin = 20 * time.Millisecond
		c.RedialMax = 100 * time.Millisecond
		if edit != nil {
			edit(c)
		}
	})
	ta.store = store
	return ta
}

// start runs the App until the test ends.
func (ta *testApp) start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ta.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v, want nil after cancel", err)
		}
	})
}

// addSim adds the sim as an approved runner pinned to its certificate.
func (ta *testApp) addSim(t *testing.T, s *simRTE) {
	t.Helper()
	if err := ta.AddRunner(context.Background(), &app.Runner{Name: s.name, URL: s.url(), Token: s.token, Certificate: s.cert.der}); err != nil {
		t.Fatal(err)
	}
}

// waitConnected waits until the App holds a socket to the runner.
func (ta *testApp) waitConnected(t *testing.T, s *simRTE) {
	t.Helper()
	recv(t, s.Welcomed(), "socket from the app to "+s.name)
	// The sim's side of the handshake ends a moment before the App starts serving the socket.
	testenv.Eventually(t, waitLimit, "the app reports "+s.name+" connected", func() bool {
		st, ok := ta.Status(s.name)
		return ok && st.Connected
	})
}

// waitJob waits, through Watch alone, until cond holds for the job, and returns it.
func (ta *testApp) waitJob(t *testing.T, id string, what string, cond func(*app.Job) bool) *app.Job {
	t.Helper()
	ch, stop := ta.Watch(id)
	defer stop()
	deadline := time.After(waitLimit)
	for {
		j, err := ta.GetJob(context.Background(), id)
		if err != nil {
			t.Fatalf("get job %s: %v", id, err)
		}
		if cond(j) {
			return j
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("job %s: want %s within %s; it is %s (status %q, message %q)", id, what, waitLimit, j.State, j.Status, j.Message)
		}
	}
}

func inState(s app.JobState) func(*app.Job) bool {
	return func(j *app.Job) bool { return j.State == s }
}

func output(text string) protocol.OutputData { return protocol.OutputData{Text: text} }

// wantRecords checks that the store holds exactly want, in order, each once.
func wantRecords(t *testing.T, ta *testApp, job string, want []protocol.Record) {
	t.Helper()
	got, err := ta.Records(context.Background(), job, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("job %s has %d records stored, want %d", job, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Seq != w.Seq || g.Kind != w.Kind || !g.At.Equal(w.At) || string(g.Data) != string(w.Data) {
			t.Fatalf("record %d of job %s is seq %d %s %s, want seq %d %s %s", i, job, g.Seq, g.Kind, g.Data, w.Seq, w.Kind, w.Data)
		}
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
