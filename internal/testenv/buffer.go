package testenv

import (
	"bytes"
	"sync"
	"time"
)

// Buffer is a bytes.Buffer that a logger or a child process writes while a test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Clock is a settable clock for code that takes a Now function: a test advances it instead of
// sleeping, so waiting a day costs nothing.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock starts a Clock at start.
func NewClock(start time.Time) *Clock { return &Clock{t: start} }

// Now is the clock's time; pass the method value as the code's Now.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
