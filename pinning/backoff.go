package pinning

import (
	"math/rand/v2"
	"time"
)

// Backoff yields jittered exponential waits between attempts to reach a peer. The base wait
// starts at Min and doubles per attempt up to Max; each wait is drawn uniformly from the upper
// half of the base, never below Min. The jitter spreads out the retries of many RTEs that lost
// the same app at the same moment, so they do not return in lockstep.
//
// A Backoff is not safe for concurrent use; each retry loop owns its own.
type Backoff struct {
	Min time.Duration // first wait; 1 s when zero
	Max time.Duration // longest wait; 60 s when zero

	attempt int
}

// Next returns the wait before the next attempt and counts the attempt.
func (b *Backoff) Next() time.Duration {
	minWait, maxWait := b.Min, b.Max
	if minWait <= 0 {
		minWait = time.Second
	}
	if maxWait <= 0 {
		maxWait = 60 * time.Second
	}
	if maxWait < minWait {
		maxWait = minWait
	}
	base := minWait
	for i := 0; i < b.attempt && base < maxWait; i++ {
		base *= 2 // stops well before overflow: base < maxWait before each doubling
	}
	if base > maxWait {
		base = maxWait
	}
	b.attempt++
	half := base / 2
	wait := base - half + rand.N(half+1)
	if wait < minWait {
		wait = minWait
	}
	return wait
}

// Reset starts the sequence again from Min, after a success.
func (b *Backoff) Reset() { b.attempt = 0 }
