package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
)

// Errors of Check, for callers that answer each differently (an HTTP status, a retry).
var (
	// ErrNotConnected: this app node holds no socket to the runner, so it cannot ask it.
	ErrNotConnected = errors.New("runner is not connected to this app node")
	// ErrCheckRefused: the runner answered the check with an error message instead of a
	// result (not approved, or too many checks running on the socket); the error says which.
	ErrCheckRefused = errors.New("runner refused the check")
	// ErrCheckUnanswered: the runner sent no answer within the check's timeout and a margin,
	// or its socket ended first.
	ErrCheckUnanswered = errors.New("runner did not answer the check")
)

const (
	// checkDefaultTimeout is what an RTE uses for a check sent with timeout 0
	// (docs/connection-checks.md); the app waits as long.
	checkDefaultTimeout = 5 * time.Second
	// maxCheckMessage bounds an outcome's message from the runner; the RTE sends at most 512
	// bytes, and a page or log line should not grow with a runner that sends more.
	maxCheckMessage = 1024
)

// checkAnswerMargin is how much longer than the check's timeout the app waits for the answer:
// the RTE answers within the timeout of receiving the check, and the margin covers the socket
// both ways and a runner busy writing records. A variable so tests need not wait 5 s.
var checkAnswerMargin = 5 * time.Second

// checkWaiters holds the checks waiting for their check.result, by check id. The zero value
// is ready to use.
type checkWaiters struct {
	mu      sync.Mutex
	waiting map[string]*checkWaiter
}

type checkWaiter struct {
	runner string
	answer chan protocol.Message // *protocol.CheckResult or *protocol.Error; buffered, one
}

func (cw *checkWaiters) add(id, runner string) *checkWaiter {
	w := &checkWaiter{runner: runner, answer: make(chan protocol.Message, 1)}
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if cw.waiting == nil {
		cw.waiting = map[string]*checkWaiter{}
	}
	cw.waiting[id] = w
	return w
}

func (cw *checkWaiters) remove(id string) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	delete(cw.waiting, id)
}

// deliver hands m to the check id of runner and reports whether one was waiting. An answer
// from another runner than the one asked is not delivered: check ids are unguessable, but a
// runner must not be able to answer for another even so.
func (cw *checkWaiters) deliver(runner, id string, m protocol.Message) bool {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	w := cw.waiting[id]
	if w == nil || w.runner != runner {
		return false
	}
	delete(cw.waiting, id)
	w.answer <- m // never blocks: buffered, and removed from the map before the one send
	return true
}

// Check asks the connected runner whether it can reach targets now, the way ansible will
// (PROTOCOL.md section 9, docs/connection-checks.md), and returns its answer: one outcome per
// target, in the targets' order. timeout bounds the whole check on the runner (0: the runner's
// default of 5 s; it caps anything over 60 s); Check waits that long plus a margin for the
// answer, and less when ctx ends first. The runner tries each target once: a caller that waits
// for a host to come up calls Check again, in its own loop.
//
// Errors: bad targets or timeout wrap *protocol.FieldError; a runner this app node holds no
// socket to wraps ErrNotConnected; a runner that answered with an error message wraps
// ErrCheckRefused; no answer in time, or a socket that ended first, wraps ErrCheckUnanswered.
// Check is safe for concurrent use, also for one runner.
func (a *App) Check(ctx context.Context, runner string, targets []protocol.CheckTarget, timeout time.Duration) (protocol.CheckResult, error) {
	if timeout < 0 {
		return protocol.CheckResult{}, fmt.Errorf("check from runner %q: timeout %s must not be negative", runner, timeout)
	}
	msg := &protocol.Check{
		ID:        newCheckID(),
		Targets:   append([]protocol.CheckTarget{}, targets...), // never null on the wire
		TimeoutMS: int((timeout + time.Millisecond - 1) / time.Millisecond),
	}
	if err := msg.Validate(); err != nil {
		return protocol.CheckResult{}, fmt.Errorf("check from runner %q: %w", runner, err)
	}
	lv := a.liveRunner(runner)
	if lv == nil {
		return protocol.CheckResult{}, fmt.Errorf("check from runner %q: %w: it must be approved and connected (inbound: the app dials it; outbound: it dials the app)", runner, ErrNotConnected)
	}
	w := a.checks.add(msg.ID, runner)
	defer a.checks.remove(msg.ID)
	if err := lv.peer.Send(ctx, msg); err != nil {
		return protocol.CheckResult{}, fmt.Errorf("check from runner %q: send check: %w", runner, err)
	}

	wait := timeout
	if wait == 0 {
		wait = checkDefaultTimeout
	}
	wait += checkAnswerMargin
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var answer protocol.Message
	select {
	case answer = <-w.answer:
	case <-ctx.Done():
		return protocol.CheckResult{}, fmt.Errorf("check from runner %q: %w", runner, ctx.Err())
	case <-timer.C:
		return protocol.CheckResult{}, fmt.Errorf("check from runner %q: %w within %s; look at the runner's log, or ask again", runner, ErrCheckUnanswered, wait)
	case <-lv.peer.Conn.Done():
		select {
		case answer = <-w.answer: // it made it before the end
		default:
			return protocol.CheckResult{}, fmt.Errorf("check from runner %q: %w: its socket closed first; ask again once it is connected", runner, ErrCheckUnanswered)
		}
	}
	switch m := answer.(type) {
	case *protocol.Error:
		return protocol.CheckResult{}, fmt.Errorf("check from runner %q: %w (%s): %s", runner, ErrCheckRefused, protocol.PeerText(m.Code, 64), protocol.PeerText(m.Message, 300))
	case *protocol.CheckResult:
		return checkOutcomes(runner, msg.Targets, m)
	}
	return protocol.CheckResult{}, fmt.Errorf("check from runner %q: unexpected answer %T", runner, answer)
}

// checkOutcomes checks that res answers targets, one outcome each and in order, and bounds
// the runner's text.
func checkOutcomes(runner string, targets []protocol.CheckTarget, res *protocol.CheckResult) (protocol.CheckResult, error) {
	if len(res.Results) != len(targets) {
		return protocol.CheckResult{}, fmt.Errorf("check from runner %q: it answered %d outcomes for %d targets", runner, len(res.Results), len(targets))
	}
	out := protocol.CheckResult{ID: res.ID, Results: make([]protocol.CheckOutcome, len(targets))}
	for i, o := range res.Results {
		if o.Host != targets[i].Host || o.Name != targets[i].Name {
			return protocol.CheckResult{}, fmt.Errorf("check from runner %q: outcome %d is for %q (%q), but target %d is %q (%q)",
				runner, i, protocol.PeerText(o.Host, 128), protocol.PeerText(o.Name, 128), i, targets[i].Host, targets[i].Name)
		}
		o.Message = protocol.PeerText(o.Message, maxCheckMessage)
		out.Results[i] = o
	}
	return out, nil
}

// checkAnswered hands a check.result from the runner to the Check waiting for it. One that
// nobody waits for (it came after Check gave up, or answers another app node's check) is
// dropped.
func (a *App) checkAnswered(lv *live, m *protocol.CheckResult) {
	if !a.checks.deliver(lv.peer.Runner, m.ID, m) {
		a.log.Debug("connection check result nobody waits for on this app node; dropped",
			zap.String("runner", lv.peer.Runner), zap.String("check", protocol.PeerText(m.ID, 128)))
	}
}

// checkRefused hands an error message from the runner whose ref is a waiting check to that
// Check, and reports whether it did.
func (a *App) checkRefused(lv *live, m *protocol.Error) bool {
	return m.Ref != "" && a.checks.deliver(lv.peer.Runner, m.Ref, m)
}

// newCheckID returns "chk-" and 16 random hex digits.
func newCheckID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return "chk-" + hex.EncodeToString(b[:])
}
