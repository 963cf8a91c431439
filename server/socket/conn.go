package socket

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/protocol"
)

// Options tunes a Conn; zero values take the protocol's defaults.
type Options struct {
	PingInterval time.Duration // default protocol.PingInterval
	DeadAfter    time.Duration // default protocol.DeadAfter
	// WriteTimeout bounds one frame's write, so a peer that stops reading cannot park the writer
	// forever; the keepalive would catch it too, but only after DeadAfter. Default 30s.
	WriteTimeout time.Duration
	// CloseGrace is how long Close waits for the peer's answering close frame before it drops
	// the TCP connection. Dropping it at once, with the peer's frames still unread, makes the
	// kernel reset the connection, and a reset can discard the close frame just written, so the
	// peer would never learn the code. Default 1s.
	CloseGrace time.Duration
	// Now is the clock of the bad-message window; default time.Now.
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.PingInterval <= 0 {
		o.PingInterval = protocol.PingInterval
	}
	if o.DeadAfter <= 0 {
		o.DeadAfter = protocol.DeadAfter
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.CloseGrace <= 0 {
		o.CloseGrace = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// ErrClosed is returned by Send and Read once the connection is closed.
var ErrClosed = errors.New("socket closed")

// controlQueue and bulkQueue are the frames waiting for the writer. Control is deep enough that
// a burst of acks does not block the reader; bulk is shallow because each frame is up to 1 MiB.
const (
	controlQueue = 256
	bulkQueue    = 4
)

// maxBinaryFrame is the largest binary frame a peer may send: one bundle chunk, tag(1) +
// sha256(32) + offset(8) + payload. The socket's read limit is sized for the largest text
// message (16 MiB), so binary frames get this tighter bound of their own.
const maxBinaryFrame = 1 + 32 + 8 + protocol.MaxChunkPayload

// maxFrame is gorilla's hard read limit: a frame beyond it closes the socket with 1009. Text
// between protocol.MaxMessageBytes and maxFrame is answered too_large instead, as the protocol
// promises, and only the first MaxMessageBytes+1 bytes of it are held in memory.
const maxFrame = 4 * protocol.MaxMessageBytes

// pongWait bounds the write of a pong answering the peer's ping; a pong that cannot be written
// in time is dropped, since the writer's own failure will end the connection anyway.
const pongWait = time.Second

type frame struct {
	kind int
	data []byte
}

// Conn is one WebSocket with a single writer. Send, SendFrame, SendBinary and Close are safe
// for concurrent use; Read must be called from one goroutine only.
type Conn struct {
	ws   *websocket.Conn
	opts Options

	control chan frame
	bulk    chan frame

	closeOnce sync.Once
	netOnce   sync.Once
	done      chan struct{}
	mu        sync.Mutex
	closeErr  error // why the connection ended, set once

	badMu    sync.Mutex
	badTimes []time.Time
}

// New wraps an upgraded or dialled connection. Call Run to start the writer.
func New(ws *websocket.Conn, opts Options) *Conn {
	opts.defaults()
	c := &Conn{
		ws:      ws,
		opts:    opts,
		control: make(chan frame, controlQueue),
		bulk:    make(chan frame, bulkQueue),
		done:    make(chan struct{}),
	}
	ws.SetReadLimit(maxFrame)
	_ = ws.SetReadDeadline(time.Now().Add(opts.DeadAfter))
	ws.SetPongHandler(func(string) error {
		return ws.SetReadDeadline(time.Now().Add(c.opts.DeadAfter))
	})
	// A ping from the peer is something arriving too, so it pushes the deadline on like a pong.
	ws.SetPingHandler(func(data string) error {
		_ = ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(pongWait))
		return ws.SetReadDeadline(time.Now().Add(c.opts.DeadAfter))
	})
	return c
}

// Subprotocol is the subprotocol the handshake settled on.
func (c *Conn) Subprotocol() string { return c.ws.Subprotocol() }

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err says why the connection ended; nil while it is open.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeErr
}

// Run writes queued frames and pings until the connection ends or ctx is done, and then closes
// it. It blocks; it returns the reason the connection ended.
func (c *Conn) Run(ctx context.Context) error {
	ticker := time.NewTicker(c.opts.PingInterval)
	defer ticker.Stop()
	for {
		// Control frames go first: an ack or a cancel must never wait behind bundle chunks.
		select {
		case f := <-c.control:
			if err := c.write(f); err != nil {
				return c.fail(err)
			}
			continue
		default:
		}
		select {
		case <-ctx.Done():
			c.Close(websocket.CloseGoingAway, "shutting down")
			return c.Err()
		case <-c.done:
			return c.Err()
		case f := <-c.control:
			if err := c.write(f); err != nil {
				return c.fail(err)
			}
		case f := <-c.bulk:
			if err := c.write(f); err != nil {
				return c.fail(err)
			}
		case <-ticker.C:
			deadline := time.Now().Add(c.opts.WriteTimeout)
			if err := c.ws.WriteControl(websocket.PingMessage, nil, deadline); err != nil {
				return c.fail(fmt.Errorf("ping: %w", err))
			}
		}
	}
}

func (c *Conn) write(f frame) error {
	_ = c.ws.SetWriteDeadline(time.Now().Add(c.opts.WriteTimeout))
	if err := c.ws.WriteMessage(f.kind, f.data); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// fail ends the connection after a write error and returns the recorded cause. A write that
// fails because Close already sent the close frame leaves the TCP connection to Close's grace.
func (c *Conn) fail(err error) error {
	if c.finish(err) {
		c.closeNet()
	}
	return c.Err()
}

// finish records why the connection ended and closes done; it reports whether this call was
// the one that ended it. It leaves the TCP connection open: see closeNet.
func (c *Conn) finish(err error) bool {
	first := false
	c.closeOnce.Do(func() {
		first = true
		c.mu.Lock()
		c.closeErr = err
		c.mu.Unlock()
		close(c.done)
	})
	return first
}

func (c *Conn) closeNet() {
	c.netOnce.Do(func() { _ = c.ws.Close() })
}

// Send encodes m and queues it as a text frame. It returns once queued, not once written.
func (c *Conn) Send(ctx context.Context, m protocol.Message) error {
	b, err := protocol.Encode(m)
	if err != nil {
		return err
	}
	return c.enqueue(ctx, c.control, frame{websocket.TextMessage, b})
}

// SendFrame queues an already encoded JSON message, such as a spooled record.
func (c *Conn) SendFrame(ctx context.Context, text []byte) error {
	return c.enqueue(ctx, c.control, frame{websocket.TextMessage, text})
}

// SendBinary queues a bundle chunk frame behind any waiting control frames.
func (c *Conn) SendBinary(ctx context.Context, b []byte) error {
	return c.enqueue(ctx, c.bulk, frame{websocket.BinaryMessage, b})
}

func (c *Conn) enqueue(ctx context.Context, q chan frame, f frame) error {
	select {
	case <-c.done:
		return ErrClosed
	default:
	}
	select {
	case q <- f:
		return nil
	case <-c.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Read returns the next data frame. Every frame, ping and pong pushes the dead-after deadline
// on; a socket silent for DeadAfter fails here with a timeout. A text frame over
// protocol.MaxMessageBytes comes back cut to MaxMessageBytes+1 bytes, so that protocol.Decode
// answers it too_large; one over 64 MiB, or a binary frame longer than one bundle chunk can be,
// closes the connection with 1009. Once the connection has ended, Read returns why (see Err).
func (c *Conn) Read() (kind int, data []byte, err error) {
	kind, r, err := c.ws.NextReader()
	if err == nil {
		if kind == websocket.BinaryMessage {
			data, err = io.ReadAll(io.LimitReader(r, maxBinaryFrame+1))
			if err == nil && len(data) > maxBinaryFrame {
				c.Close(websocket.CloseMessageTooBig, fmt.Sprintf("binary frame over %d bytes", maxBinaryFrame))
				return 0, nil, c.Err()
			}
		} else {
			data, err = io.ReadAll(io.LimitReader(r, protocol.MaxMessageBytes+1))
			if err == nil && len(data) > protocol.MaxMessageBytes {
				// Skip the rest of the frame (gorilla's read limit bounds it) and hand over the
				// cut text: protocol.Decode answers it too_large and the socket stays open.
				_, err = io.Copy(io.Discard, r)
			}
		}
	}
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("nothing arrived for %s, the peer is gone: %w", c.opts.DeadAfter, err)
		}
		c.finish(fmt.Errorf("read: %w", err))
		// Nothing more will be read, so there is no close answer left to wait for.
		c.closeNet()
		return 0, nil, c.Err()
	}
	_ = c.ws.SetReadDeadline(time.Now().Add(c.opts.DeadAfter))
	return kind, data, nil
}

// Close sends a close frame with code and reason and ends the connection: Done is closed and
// Send fails at once. The TCP connection stays open until the peer answers the close (seen by
// Read) or CloseGrace passes, so the close frame reaches the peer. Safe to call more than once
// and from any goroutine; only the first call has an effect. reason is cut to the 123 bytes a
// close frame can carry.
func (c *Conn) Close(code int, reason string) {
	select {
	case <-c.done:
		return
	default:
	}
	reason = clipReason(reason)
	// WriteControl may run concurrently with the writer goroutine (gorilla allows it), so a
	// close never waits behind queued frames.
	msg := websocket.FormatCloseMessage(code, reason)
	_ = c.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
	if c.finish(&websocket.CloseError{Code: code, Text: reason}) {
		time.AfterFunc(c.opts.CloseGrace, c.closeNet)
	}
}

// maxCloseReason is what a close frame's 125-byte payload leaves after the 2-byte code; gorilla
// refuses to send a longer one, so the close would silently not happen.
const maxCloseReason = 123

// clipReason cuts reason to maxCloseReason bytes on a character boundary: a peer refuses a
// close reason that is not valid UTF-8.
func clipReason(reason string) string {
	if len(reason) <= maxCloseReason {
		return reason
	}
	reason = reason[:maxCloseReason]
	for !utf8.ValidString(reason) {
		reason = reason[:len(reason)-1]
	}
	return reason
}

// ReportBad answers a bad message with an error message and counts it. More than
// protocol.MaxBadMessages within protocol.BadMessageWindow closes the connection with 1008; then
// ReportBad returns an error saying so, and the caller stops reading.
func (c *Conn) ReportBad(ctx context.Context, e protocol.Error) error {
	now := c.opts.Now()
	c.badMu.Lock()
	cut := 0
	for cut < len(c.badTimes) && now.Sub(c.badTimes[cut]) >= protocol.BadMessageWindow {
		cut++
	}
	c.badTimes = append(c.badTimes[cut:], now)
	n := len(c.badTimes)
	c.badMu.Unlock()
	if n > protocol.MaxBadMessages {
		reason := fmt.Sprintf("more than %d bad messages in %s", protocol.MaxBadMessages, protocol.BadMessageWindow)
		c.Close(protocol.ClosePolicyViolation, reason)
		return errors.New(reason)
	}
	return c.Send(ctx, e)
}

// CloseCode extracts the WebSocket close code from an error returned by Read or Err, or 0.
func CloseCode(err error) int {
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Code
	}
	return 0
}
