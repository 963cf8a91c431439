package sse

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzSSEReader reads arbitrary bytes as an event stream: no panic, and every event it
// returns was terminated by a blank line.
func FuzzSSEReader(f *testing.F) {
	f.Add([]byte("retry: 2000\n\nid: 1\nevent: record\ndata: {\"seq\":1}\n\n: keepalive\n\nevent: job\ndata: {}\n\n"))
	f.Add([]byte("data: a\ndata: b\n\nid\n\nevent:\n\n"))
	f.Add([]byte("id: 1\r\nevent: x\r\n\r\n"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		r := NewReader(bytes.NewReader(stream))
		for i := 0; ; i++ {
			_, err := r.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if i > len(stream) {
				t.Fatalf("more events than bytes")
			}
		}
	})
}
