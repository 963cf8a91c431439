package pinning_test

import (
	"testing"
	"time"

	"github.com/rte-project/rte/pinning"
)

func TestBackoffGrowsWithinBounds(t *testing.T) {
	b := pinning.Backoff{Min: time.Second, Max: 60 * time.Second}
	base := time.Second
	for i := range 12 {
		got := b.Next()
		low := max(time.Second, base/2)
		if got < low || got > base {
			t.Errorf("attempt %d: wait %v, want within [%v, %v]", i, got, low, base)
		}
		base = min(2*base, 60*time.Second)
	}
	b.Reset()
	if got := b.Next(); got != time.Second {
		t.Errorf("first wait after Reset = %v, want Min (1s)", got)
	}
}

func TestBackoffJitters(t *testing.T) {
	// At the cap, 50 draws from [30s, 60s] all equal would mean no jitter at all.
	b := pinning.Backoff{Min: time.Second, Max: 60 * time.Second}
	for range 10 {
		b.Next()
	}
	seen := map[time.Duration]bool{}
	for range 50 {
		seen[b.Next()] = true
	}
	if len(seen) < 2 {
		t.Errorf("50 waits at the cap took %d distinct values, want them spread", len(seen))
	}
}

func TestBackoffDefaultsAndOddSettings(t *testing.T) {
	var zero pinning.Backoff
	if got := zero.Next(); got != time.Second {
		t.Errorf("zero Backoff first wait = %v, want the 1s default", got)
	}
	for range 100 {
		if got := zero.Next(); got > 60*time.Second {
			t.Fatalf("zero Backoff wait %v exceeds the 60s default cap", got)
		}
	}
	inverted := pinning.Backoff{Min: 5 * time.Second, Max: time.Second}
	for range 5 {
		if got := inverted.Next(); got != 5*time.Second {
			t.Errorf("Max below Min: wait %v, want Min (5s)", got)
		}
	}
}
