package testenv

import "time"

// T is the part of testing.TB the helpers use. Declaring it here, instead of taking
// testing.TB, keeps package testing out of the demo binary.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
	Failed() bool
	TempDir() string
}

// PollEvery is the longest Poll and Eventually wait between looks. They start at a
// millisecond and double up to it: a condition that holds almost at once costs almost
// nothing, and a long wait does not busy a 2-core machine.
const PollEvery = 20 * time.Millisecond

// Poll calls cond until it returns true (Poll returns true) or within has passed (Poll
// returns false after one last look). cond runs on the caller's goroutine, so a test may call
// t.Fatal in it.
func Poll(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	pause := time.Millisecond
	for {
		if cond() {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, PollEvery)
	}
}

// Eventually is Poll that fails t when cond has not held within: "<what> not within <within>".
// Tests whose failure must say more (the state they saw) call Poll and fail themselves.
func Eventually(t T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(within, cond) {
		t.Fatalf("%s: not within %s", what, within)
	}
}
