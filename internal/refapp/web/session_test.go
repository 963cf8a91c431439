package web

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestSafeNext(t *testing.T) {
	cases := map[string]string{
		"":                         "/runners",
		"/jobs/abc":                "/jobs/abc",
		"/jobs?runner=r1":          "/jobs?runner=r1",
		"//evil.example/x":         "/runners",
		"/\\evil.example":          "/runners",
		"https://evil.example/":    "/runners",
		"javascript:alert(1)":      "/runners",
		"jobs":                     "/runners",
		"/jobs\r\nSet-Cookie: x=y": "/runners",
	}
	for in, want := range cases {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSessionStoreExpiry(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	s := newSessionStore(func() time.Time { return now })
	id := s.create()
	sess, ok := s.get(id)
	if !ok || len(sess.csrf) != 64 {
		t.Fatalf("a new session: %v %+v, want live with a 64-digit csrf token", ok, sess)
	}
	if _, ok := s.get(id + "x"); ok {
		t.Errorf("an unknown id was taken for a session")
	}
	now = now.Add(sessionIdle - time.Minute)
	if _, ok := s.get(id); !ok {
		t.Errorf("a session used %s ago ended, want it live until %s idle", sessionIdle-time.Minute, sessionIdle)
	}
	now = now.Add(sessionIdle + time.Second)
	if _, ok := s.get(id); ok {
		t.Errorf("a session idle for more than %s is still live", sessionIdle)
	}

	busy := s.create()
	for step := time.Duration(0); step <= sessionMax; step += sessionIdle / 2 {
		now = now.Add(sessionIdle / 2)
		if _, ok := s.get(busy); !ok {
			break
		}
	}
	if _, ok := s.get(busy); ok {
		t.Errorf("a session used all along is still live after %s, want it ended", sessionMax)
	}

	first := s.create()
	for range maxSessions {
		now = now.Add(time.Millisecond)
		s.create()
	}
	if _, ok := s.get(first); ok {
		t.Errorf("after %d more sign-ins the oldest session is still live, want it ended", maxSessions)
	}
	if n := len(s.m); n > maxSessions {
		t.Errorf("%d sessions held, want at most %d", n, maxSessions)
	}
}

func TestOutputTailKeepsTheEnd(t *testing.T) {
	o := outputTail{max: 20}
	for i := range 10 {
		o.add(outputPiece{Text: fmt.Sprintf("line %d\n", i)})
	}
	var got strings.Builder
	for _, p := range o.pieces {
		got.WriteString(p.Text)
	}
	if !o.cut || got.String() != "line 8\nline 9\n" || o.size != len(got.String()) {
		t.Errorf("tail of 10 lines within 20 bytes: %q (cut %v, size %d), want the last whole lines", got.String(), o.cut, o.size)
	}
	o = outputTail{max: 10}
	o.add(outputPiece{Text: "0123456789abcdef\nlast\n"})
	if o.pieces[0].Text != "last\n" || o.size != 5 {
		t.Errorf("one long piece within 10 bytes: %q size %d, want %q", o.pieces[0].Text, o.size, "last\n")
	}
}
