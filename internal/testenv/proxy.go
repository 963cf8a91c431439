package testenv

import (
	"bufio"
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
// carries, which drops a socket without either peer closing it.
type Forwarder struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
	// refusing closes every new connection at once, as a firewall that drops the way would.
	refusing atomic.Bool
	// toTarget counts the bytes carried towards the target, over every connection.
	toTarget atomic.Int64
}

// StartForwarder forwards a new loopback port to target until the test ends.
func StartForwarder(t T, target string) *Forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("forwarder: %v", err)
	}
	f := &Forwarder{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(func() {
		ln.Close()
		f.Drop()
		f.wg.Wait()
	})
	return f
}

// Addr is the forwarder's own address, host:port.
func (f *Forwarder) Addr() string { return f.ln.Addr().String() }

// Refuse makes the forwarder close new connections at once (on) or carry them again (off).
func (f *Forwarder) Refuse(on bool) { f.refusing.Store(on) }

// ToTarget is how many bytes the forwarder has carried towards its target, over all its
// connections so far: what the dialling side sent on the wire, TLS included.
func (f *Forwarder) ToTarget() int64 { return f.toTarget.Load() }

// Drop cuts every connection through the forwarder; it returns how many it cut.
func (f *Forwarder) Drop() int {
	f.mu.Lock()
	defer f.mu.Unlock()
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
		go f.pipe(c, up, nil)
		go f.pipe(up, c, &f.toTarget)
	}
}

func (f *Forwarder) pipe(dst, src net.Conn, count *atomic.Int64) {
	defer f.wg.Done()
	var w io.Writer = dst
	if count != nil {
		w = countWriter{dst, count}
	}
	_, _ = io.Copy(w, src)
	dst.Close()
	src.Close()
	f.mu.Lock()
	delete(f.conns, dst)
	delete(f.conns, src)
	f.mu.Unlock()
}

// countWriter counts what it writes as it writes it, so a reader of the count sees bytes of
// connections still open.
type countWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}
