package pgtest

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
)

// Proxy forwards loopback TCP connections to the server until Cut, which closes every
// connection and stops listening: the database going away, as a crash or a network cut looks
// to an app node that reaches it through the proxy. Resume listens again at the same address.
type Proxy struct {
	// Addr is host:port of the proxy, fixed for its life.
	Addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns []net.Conn
	wg    sync.WaitGroup
}

// Proxy starts a proxy to the server on a free loopback port.
func (s *Server) Proxy() (*Proxy, error) {
	p := &Proxy{Addr: "127.0.0.1:0", target: fmt.Sprintf("127.0.0.1:%d", s.Port)}
	if err := p.Resume(); err != nil {
		return nil, err
	}
	return p, nil
}

// URL is url (one of Server.URL's) through the proxy.
func (p *Proxy) URL(url string) string { return strings.Replace(url, p.target, p.Addr, 1) }

// Resume listens at Addr again after a Cut.
func (p *Proxy) Resume() error {
	ln, err := net.Listen("tcp", p.Addr)
	if err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	p.mu.Lock()
	p.ln, p.Addr = ln, ln.Addr().String()
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return nil
}

// Cut stops listening and closes every connection, then waits for its goroutines. Calling it
// again does nothing.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
