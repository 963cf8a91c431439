package check_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rte-project/rte/internal/check"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// TestBatch checks 500 targets at once: 450 closed ports (SSH and WinRM) and 50 listeners
// that never speak. With 64 slots, the 50 hung ones hold 50 slots until the deadline while
// the other 14 work through the refusals, so every target is tried and Run returns at about
// one timeout. goleak (TestMain) then checks that nothing it started is left.
func TestBatch(t *testing.T) {
	const (
		n         = 500
		hung      = 50
		timeoutMS = 1500
	)
	ch := newChecker(t, check.Config{Concurrency: 64})
	closed, silent := closedPort(t), silentListener(t)
	check.SetWinRMHTTPPort(ch, closed)
	c := &protocol.Check{ID: "batch", TimeoutMS: timeoutMS}
	want := make([]string, n)
	for i := range n {
		tg := protocol.CheckTarget{Name: fmt.Sprintf("host%03d", i), Host: "127.0.0.1", Port: closed, User: "ansible", Transport: protocol.TransportSSH}
		want[i] = protocol.CheckUnreachable
		switch {
		case i%10 == 3: // spread over the batch, so hung targets are taken among the others
			tg.Port = silent
			want[i] = protocol.CheckTimeout
		case i%2 == 0:
			tg.Transport = protocol.TransportWinRM
		}
		c.Targets = append(c.Targets, tg)
	}

	start := time.Now()
	res := ch.Run(context.Background(), c)
	elapsed := time.Since(start)

	// A safety net, not a measurement: without the deadline, or with a goroutine per slot
	// that waits for another, this would take far longer.
	if limit := 4 * timeoutMS * time.Millisecond; elapsed > limit {
		t.Errorf("Run took %s for %d targets with timeout_ms %d, want well under %s", elapsed, n, timeoutMS, limit)
	}
	if len(res.Results) != n {
		t.Fatalf("want %d outcomes, got %d", n, len(res.Results))
	}
	counts := make(map[string]int)
	for i, o := range res.Results {
		counts[o.Status]++
		if o.Name != c.Targets[i].Name {
			t.Fatalf("outcome %d is for %q, want %q: outcomes must keep the targets' order", i, o.Name, c.Targets[i].Name)
		}
		if o.Status != want[i] {
			t.Errorf("%s (port %d): status %q (%s), want %q", o.Name, c.Targets[i].Port, o.Status, o.Message, want[i])
		}
		if strings.HasPrefix(o.Message, "not tried") {
			t.Errorf("%s was not tried (%s): 14 free slots should reach every refused port within the timeout", o.Name, o.Message)
		}
	}
	t.Logf("%d targets in %s: %v", n, elapsed, counts)
	if counts[protocol.CheckTimeout] != hung {
		t.Errorf("want %d timeouts, got %d", hung, counts[protocol.CheckTimeout])
	}
}

// TestBatchSlots checks that targets still waiting for a slot at the deadline are answered
// "timeout" at once, not tried late.
func TestBatchSlots(t *testing.T) {
	ch := newChecker(t, check.Config{Concurrency: 2})
	silent := silentListener(t)
	c := &protocol.Check{ID: "slots", TimeoutMS: 300}
	for i := range 6 {
		c.Targets = append(c.Targets, protocol.CheckTarget{Name: fmt.Sprint(i), Host: "127.0.0.1", Port: silent, User: "ansible", Transport: protocol.TransportSSH})
	}
	res := ch.Run(context.Background(), c)
	if len(res.Results) != len(c.Targets) {
		t.Fatalf("want %d outcomes, got %d", len(c.Targets), len(res.Results))
	}
	for i, o := range res.Results {
		// The first two take the slots and hang until the deadline; the rest never start.
		wantPart := "not tried"
		if i < 2 {
			wantPart = "handshake did not finish"
		}
		wantOutcome(t, o, protocol.CheckTimeout, wantPart)
	}
}

// TestSlotsAreShared checks that Concurrency bounds the tries of all checks together: two
// checks of two hung targets each, with two slots, leave two targets untried.
func TestSlotsAreShared(t *testing.T) {
	ch := newChecker(t, check.Config{Concurrency: 2})
	// The second check starts only once the first one's two targets hold both slots (their
	// connections accepted), and its deadline falls well inside the first one's: under load,
	// starting both at once let the first time out before the second began (seen once in a
	// full run), and then all four were tried.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 4)
	var accepting sync.WaitGroup
	accepting.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	})
	t.Cleanup(func() {
		ln.Close()
		accepting.Wait()
		close(accepted)
		for c := range accepted {
			c.Close()
		}
	})
	silent := ln.Addr().(*net.TCPAddr).Port
	results := make(chan protocol.CheckResult, 2)
	var wg sync.WaitGroup
	for i, timeout := range []int{2000, 300} {
		c := &protocol.Check{ID: fmt.Sprint("check", i), TimeoutMS: timeout}
		for j := range 2 {
			c.Targets = append(c.Targets, protocol.CheckTarget{Name: fmt.Sprint(i, j), Host: "127.0.0.1", Port: silent, User: "ansible", Transport: protocol.TransportSSH})
		}
		wg.Go(func() { results <- ch.Run(context.Background(), c) })
		if i == 0 {
			if !testenv.Poll(10*time.Second, func() bool { return len(accepted) >= 2 }) {
				t.Fatalf("the first check's two targets never connected")
			}
		}
	}
	wg.Wait()
	close(results)
	var notTried, tried int
	for res := range results {
		for _, o := range res.Results {
			switch {
			case o.Status != protocol.CheckTimeout:
				t.Errorf("%s: status %q (%s), want timeout", o.Name, o.Status, o.Message)
			case strings.HasPrefix(o.Message, "not tried"):
				notTried++
			default:
				tried++
			}
		}
	}
	// The first check's hung targets hold both slots past the second check's deadline, so the
	// second's targets are never tried; with slots per check, all four would be.
	if tried < 2 || notTried < 1 || tried+notTried != 4 {
		t.Errorf("with 2 slots for 4 hung targets: %d tried and %d not tried, want at least 2 tried and 1 not", tried, notTried)
	}
}

// TestTimeoutDefaultAndCap checks which timeout a check gets: timeout_ms when given, the
// default for 0, and the cap for anything longer, however large.
func TestTimeoutDefaultAndCap(t *testing.T) {
	ch := newChecker(t, check.Config{DefaultTimeout: 200 * time.Millisecond, MaxTimeout: 300 * time.Millisecond})
	silent := silentListener(t)
	cases := []struct {
		timeoutMS int
		want      string
	}{
		{100, "within 100 ms"},
		{0, "within 200 ms"},
		{301, "within 300 ms"},
		{math.MaxInt, "within 300 ms"},
	}
	for _, tc := range cases {
		o := runOne(t, ch, protocol.CheckTarget{Name: "h", Host: "127.0.0.1", Port: silent, User: "u", Transport: protocol.TransportSSH}, tc.timeoutMS)
		wantOutcome(t, o, protocol.CheckTimeout, tc.want)
	}
}

// TestEmptyAndUnknown checks a check without targets, and a transport Run does not know
// (the protocol refuses it, but Run does not rely on that).
func TestEmptyAndUnknown(t *testing.T) {
	ch := newChecker(t, check.Config{})
	res := ch.Run(context.Background(), &protocol.Check{ID: "empty"})
	if res.ID != "empty" || res.Results == nil || len(res.Results) != 0 {
		t.Errorf("want id empty with an empty, non-nil results list, got %q %#v", res.ID, res.Results)
	}
	o := runOne(t, ch, protocol.CheckTarget{Name: "x", Host: "127.0.0.1", Transport: "telnet"}, 100)
	wantOutcome(t, o, protocol.CheckUnreachable, `"telnet" is not supported`)
}

func TestNewRefusesBadConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  check.Config
		want string
	}{
		{"negative concurrency", check.Config{SSHDir: "/x", Concurrency: -1}, "concurrency must not be negative, got -1"},
		{"negative timeout", check.Config{SSHDir: "/x", DefaultTimeout: -time.Second}, "default timeout must not be negative"},
		{"negative max timeout", check.Config{SSHDir: "/x", MaxTimeout: -time.Second}, "max timeout must not be negative"},
		{"default above max", check.Config{SSHDir: "/x", DefaultTimeout: time.Minute, MaxTimeout: time.Second}, "default timeout 1m0s is longer than max timeout 1s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := check.New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New(%+v): want an error containing %q, got %v", tc.cfg, tc.want, err)
			}
		})
	}
}
