package testenv

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// ConnectProxy is an HTTP CONNECT proxy on 127.0.0.1 that maps the names in its resolve table
// to addresses, as a proxy with its own DNS would, and keeps every target it was asked for. A
// test dials a name only the proxy can resolve, so a socket that works can only have come
// through the proxy.
type ConnectProxy struct {
	ln      net.Listener
	resolve map[string]string
	wg      sync.WaitGroup

	mu      sync.Mutex
	targets []string
	conns   []net.Conn
}

// StartConnectProxy starts a ConnectProxy that knows only the names in resolve (host:port to
// address) and stops it, closing every connection, when the test ends.
func StartConnectProxy(t T, resolve map[string]string) *ConnectProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("connect proxy: %v", err)
	}
	p := &ConnectProxy{ln: ln, resolve: resolve}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.track(c)
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.handle(c) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's address, host:port.
func (p *ConnectProxy) Addr() string { return p.ln.Addr().String() }

// Seen is every CONNECT target asked for so far, in order.
func (p *ConnectProxy) Seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.targets)
}

func (p *ConnectProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *ConnectProxy) handle(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		_, _ = io.WriteString(c, "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
		return
	}
	p.mu.Lock()
	p.targets = append(p.targets, req.Host)
	p.mu.Unlock()
	target, ok := p.resolve[req.Host]
	if !ok {
		// Only the names it was given: this proxy must never reach beyond the machine.
		_, _ = io.WriteString(c, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
		return
	}
	up, err := net.Dial("tcp", target)
	if err != nil {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		return
	}
	p.track(up)
	defer up.Close()
	_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, br)
		up.Close()
	}()
	_, _ = io.Copy(c, up)
	c.Close()
	<-done
}

// Forwarder forwards TCP from a loopback port to a target and can cut every connection it
// carries, which drops a socket without either peer closing it; stall them, which keeps the
// connections open but moves no byte (a peer that vanished without a FIN or RST); or cut them
// once a number of bytes has passed (a transfer cut half-way).
type Forwarder struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	// refusing closes every new connection at once, as a firewall that drops the way would.
	refusing atomic.Bool
	// toTarget counts the bytes carried towards the target, over every connection.
	toTarget atomic.Int64
	// carried counts the bytes written to either side, for DropAfter and Carried.
	carried atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// flowing is closed while bytes may move; Stall(true) replaces it with an open one that
	// Stall(false) closes, releasing every pipe waiting on it.
	flowing chan struct{}
	// dropAt, when above 0, is the carried count at which every connection is cut; dropped is
	// closed then.
	dropAt  int64
	dropped chan struct{}
}

// StartForwarder forwards a new loopback port to target until the test ends.
func StartForwarder(t T, target string) *Forwarder {
	t.Helper()
	f, err := NewForwarder(target)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(f.Close)
	return f
}

// NewForwarder forwards a new loopback port to target until Close; for a program (the chaos
// harness) rather than a test.
func NewForwarder(target string) (*Forwarder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("forwarder: %w", err)
	}
	open := make(chan struct{})
	close(open)
	f := &Forwarder{ln: ln, target: target, conns: map[net.Conn]struct{}{}, flowing: open}
	f.wg.Add(1)
	go f.accept()
	return f, nil
}

// Close stops listening, lets stalled bytes go, cuts every connection and waits for its
// goroutines.
func (f *Forwarder) Close() {
	f.ln.Close()
	f.Stall(false)
	f.Drop()
	f.wg.Wait()
}

// Addr is the forwarder's own address, host:port.
func (f *Forwarder) Addr() string { return f.ln.Addr().String() }

// Refuse makes the forwarder close new connections at once (on) or carry them again (off).
func (f *Forwarder) Refuse(on bool) { f.refusing.Store(on) }

// ToTarget is how many bytes the forwarder has carried towards its target, over all its
// connections so far: what the dialling side sent on the wire, TLS included.
func (f *Forwarder) ToTarget() int64 { return f.toTarget.Load() }

// Stall stops moving bytes on every connection, open or new, without closing any (on), or
// lets them move again, the held bytes first (off). While stalled the kernel's buffers fill
// and the peers' writes block, as on a path that lost every packet.
func (f *Forwarder) Stall(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.flowing:
		if on {
			f.flowing = make(chan struct{})
		}
	default:
		if !on {
			close(f.flowing)
		}
	}
}

// Carried is the number of bytes the forwarder has written to either side so far.
func (f *Forwarder) Carried() int64 { return f.carried.Load() }

// DropAfter cuts every connection once n more bytes have been carried (either way), replacing
// an earlier DropAfter not yet done. The returned channel is closed when the cut happened.
func (f *Forwarder) DropAfter(n int64) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropAt = f.carried.Load() + n
	f.dropped = make(chan struct{})
	return f.dropped
}

// Drop cuts every connection through the forwarder; it returns how many it cut.
func (f *Forwarder) Drop() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dropLocked()
}

func (f *Forwarder) dropLocked() int {
	n := len(f.conns) / 2
	for c := range f.conns {
		c.Close()
	}
	return n
}

func (f *Forwarder) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		if f.refusing.Load() {
			c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", f.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns[c], f.conns[up] = struct{}{}, struct{}{}
		f.mu.Unlock()
		f.wg.Add(2)
		go f.pipe(c, up, false)
		go f.pipe(up, c, true)
	}
}

// pipe copies src to dst by hand rather than with io.Copy: a stall must hold bytes between a
// read and its write, and DropAfter must count each write.
func (f *Forwarder) pipe(dst, src net.Conn, toTarget bool) {
	defer f.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f.mu.Lock()
			flowing := f.flowing
			f.mu.Unlock()
			<-flowing
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
			if toTarget {
				f.toTarget.Add(int64(n))
			}
			f.count(int64(n))
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	f.mu.Lock()
	delete(f.conns, dst)
	delete(f.conns, src)
	f.mu.Unlock()
}

func (f *Forwarder) count(n int64) {
	total := f.carried.Add(n)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dropAt > 0 && total >= f.dropAt {
		f.dropAt = 0
		f.dropLocked()
		close(f.dropped)
	}
}
