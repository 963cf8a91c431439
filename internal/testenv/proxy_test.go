package testenv

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer answers each line with the same line, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// TestForwarderStallHoldsBytesAndDropAfterCuts: a stalled forwarder keeps the connection open
// but delivers nothing until it flows again; DropAfter cuts once the bytes have passed.
func TestForwarderStallHoldsBytesAndDropAfterCuts(t *testing.T) {
	f, err := NewForwarder(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := net.Dial("tcp", f.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	echo := func(line string, within time.Duration) (string, error) {
		if _, err := io.WriteString(c, line+"\n"); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(within))
		got, err := r.ReadString('\n')
		return strings.TrimSuffix(got, "\n"), err
	}
	if got, err := echo("one", 5*time.Second); err != nil || got != "one" {
		t.Fatalf("echo through the forwarder = %q, %v; want one", got, err)
	}

	f.Stall(true)
	if got, err := echo("two", 300*time.Millisecond); err == nil {
		t.Fatalf("a stalled forwarder delivered %q", got)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("a stalled forwarder ended the connection (%v); want it open and silent", err)
	}
	f.Stall(false)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "two\n" {
		t.Fatalf("after the stall the held bytes came as %q, %v; want two", got, err)
	}

	before := f.Carried()
	cut := f.DropAfter(1000)
	if _, err := io.WriteString(c, strings.Repeat("x", 2000)+"\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cut:
	case <-time.After(5 * time.Second):
		t.Fatalf("DropAfter(1000) did not cut after %d bytes were carried", f.Carried()-before)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(r); err != nil {
		t.Fatalf("after the cut the connection ended with %v, want EOF", err)
	}
}
