package jobs

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"unicode/utf8"
)

// readSize is one read from a pipe; a pipe holds 64 KiB, so two reads empty a full one.
const readSize = 32 << 10

// readBufs are the pipe readers' buffers. A reader takes one only once its pipe is readable and
// the job's goroutine returns it after use, so an idle job holds none.
var readBufs = sync.Pool{New: func() any { b := make([]byte, readSize); return &b }}

// pipeReader reads one pipe until EOF (or its read deadline) and hands each piece to the job's
// goroutine. Sends block while the job's goroutine is busy: that is the back pressure that
// keeps a job's memory bounded (the child then blocks on a full pipe, until the spool catches up).
type pipeReader struct {
	f   *os.File
	ch  chan *[]byte // closed at EOF; each piece is a readBufs buffer cut to its length
	err error        // why reading stopped, other than EOF; read after ch is closed
}

func newPipeReader(f *os.File) *pipeReader {
	return &pipeReader{f: f, ch: make(chan *[]byte, 2)}
}

func (p *pipeReader) run() {
	defer close(p.ch)
	rc, err := p.f.SyscallConn()
	if err != nil {
		p.err = err
		return
	}
	for {
		var buf *[]byte
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			b := readBufs.Get().(*[]byte)
			for {
				n, rerr = syscall.Read(int(fd), (*b)[:readSize])
				if rerr != syscall.EINTR {
					break
				}
			}
			if rerr == syscall.EAGAIN {
				readBufs.Put(b)
				return false // wait until readable, holding no buffer
			}
			buf = b
			return true
		})
		switch {
		case err != nil:
			p.err = err
		case rerr != nil:
			p.err = rerr
		case n == 0:
			// EOF: every writer has closed its end.
		default:
			*buf = (*buf)[:n]
			p.ch <- buf
			continue
		}
		if buf != nil {
			readBufs.Put(buf)
		}
		if errors.Is(p.err, os.ErrClosed) {
			p.err = nil
		}
		return
	}
}

// putBuf returns a piece's buffer to the pool.
func putBuf(b *[]byte) {
	*b = (*b)[:readSize]
	readBufs.Put(b)
}

// appendJSONString appends s as a JSON string. s is valid UTF-8 (validUTF8 made it so), so only
// quotes, backslashes and control characters need escaping; HTML characters are left alone.
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !jsonEscaped[c] {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// jsonEscaped marks the bytes a JSON string cannot hold as they are.
var jsonEscaped = func() (t [256]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// runeCut returns the largest n <= limit such that p[:n] ends on a rune boundary.
func runeCut(p []byte, limit int) int {
	if limit >= len(p) {
		return len(p)
	}
	n := limit
	for n > 0 && !utf8.RuneStart(p[n]) {
		n--
	}
	return n
}
