package socket_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
	"go.uber.org/goleak"

	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/socket"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitLimit is a safety net for reads in these tests, not a measurement.
const waitLimit = 10 * time.Second

// serve starts a WebSocket server on 127.0.0.1:0 that wraps each accepted socket in a
// socket.Conn with opts, runs its writer, and hands it to handle. It returns a dialled client.
// Cleanup closes the client and waits until handle and the writer have returned.
func serve(t *testing.T, opts socket.Options, handle func(ctx context.Context, c *socket.Conn)) *websocket.Conn {
	t.Helper()
	var handlers sync.WaitGroup
	// Large buffers keep the 16 MiB frames of one test from costing thousands of syscalls.
	up := websocket.Upgrader{Subprotocols: []string{protocol.Subprotocol}, ReadBufferSize: 1 << 20}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			t.Errorf("upgrade: %v", err)
			return
		}
		c := socket.New(ws, opts)
		ctx, cancel := context.WithCancel(context.Background())
		writer := make(chan struct{})
		go func() {
			defer close(writer)
			_ = c.Run(ctx)
		}()
		handle(ctx, c)
		cancel()
		<-writer
	}))
	d := websocket.Dialer{Subprotocols: []string{protocol.Subprotocol}, HandshakeTimeout: waitLimit, WriteBufferSize: 1 << 20}
	client, resp, err := d.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		srv.Close()
		t.Fatalf("dial: %v", err)
	}
	_ = resp.Body.Close()
	t.Cleanup(func() {
		_ = client.Close()
		handlers.Wait()
		srv.Close()
	})
	return client
}

// echo sends every frame it reads back on the same Conn.
func echo(ctx context.Context, c *socket.Conn) {
	for {
		kind, data, err := c.Read()
		if err != nil {
			return
		}
		if kind == websocket.BinaryMessage {
			err = c.SendBinary(ctx, data)
		} else {
			err = c.SendFrame(ctx, data)
		}
		if err != nil {
			return
		}
	}
}

// readUntilClose reads frames until the peer's close arrives and returns the frames and the close.
func readUntilClose(t *testing.T, ws *websocket.Conn) ([][]byte, *websocket.CloseError) {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(waitLimit))
	var frames [][]byte
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) {
				t.Fatalf("read: got %v, want a close frame from the server", err)
			}
			return frames, ce
		}
		frames = append(frames, data)
	}
}

func TestEchoRoundTrip(t *testing.T) {
	client := serve(t, socket.Options{}, echo)
	if got := client.Subprotocol(); got != protocol.Subprotocol {
		t.Fatalf("subprotocol %q, want %q", got, protocol.Subprotocol)
	}
	text := []byte(`{"type":"ack","job":"j1","seq":7}`)
	chunk, err := protocol.EncodeChunk([32]byte{1, 2, 3}, 4096, bytes.Repeat([]byte{0xab}, 1000))
	if err != nil {
		t.Fatal(err)
	}
	_ = client.SetReadDeadline(time.Now().Add(waitLimit))
	for _, f := range []struct {
		kind int
		data []byte
	}{{websocket.TextMessage, text}, {websocket.BinaryMessage, chunk}} {
		if err := client.WriteMessage(f.kind, f.data); err != nil {
			t.Fatalf("write: %v", err)
		}
		kind, got, err := client.ReadMessage()
		if err != nil {
			t.Fatalf("read echo: %v", err)
		}
		if kind != f.kind || !bytes.Equal(got, f.data) {
			t.Fatalf("echo: got kind %d, %d bytes; want kind %d, %d bytes, equal", kind, len(got), f.kind, len(f.data))
		}
	}
}

func TestKeepaliveDeath(t *testing.T) {
	readErr := make(chan error, 1)
	// The client below never reads, so it never answers a ping: after DeadAfter of silence the
	// server's Read must fail with a timeout.
	serve(t, socket.Options{PingInterval: 50 * time.Millisecond, DeadAfter: 150 * time.Millisecond},
		func(ctx context.Context, c *socket.Conn) {
			_, _, err := c.Read()
			readErr <- err
		})
	select {
	case err := <-readErr:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("Read on a silent peer: got %v, want a timeout", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Read on a silent peer did not fail")
	}
}

func TestKeepaliveAnsweredPingsKeepSocket(t *testing.T) {
	got := make(chan []byte, 1)
	client := serve(t, socket.Options{PingInterval: 30 * time.Millisecond, DeadAfter: 300 * time.Millisecond},
		func(ctx context.Context, c *socket.Conn) {
			_, data, err := c.Read()
			if err != nil {
				t.Errorf("Read on a peer that answers pings: %v", err)
			}
			got <- data
		})
	// The client's reader answers pings; it stays silent otherwise for several DeadAfter spans.
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			if _, _, err := client.ReadMessage(); err != nil {
				return
			}
		}
	}()
	time.Sleep(2 * 300 * time.Millisecond) // twice DeadAfter
	if err := client.WriteMessage(websocket.TextMessage, []byte("late")); err != nil {
		t.Fatalf("write after twice DeadAfter of quiet: %v", err)
	}
	select {
	case data := <-got:
		if string(data) != "late" {
			t.Fatalf("server read %q, want %q", data, "late")
		}
	case <-time.After(waitLimit):
		t.Fatal("server read nothing")
	}
	_ = client.Close()
	<-readDone
}

func TestTooManyBadMessagesClose1008(t *testing.T) {
	reportErr := make(chan error, 1)
	client := serve(t, socket.Options{}, func(ctx context.Context, c *socket.Conn) {
		for {
			if _, _, err := c.Read(); err != nil {
				reportErr <- nil
				return
			}
			if err := c.ReportBad(ctx, protocol.Error{Code: protocol.ErrBadJSON, Message: "not JSON"}); err != nil {
				reportErr <- err
				return
			}
		}
	})
	// Up to the budget every bad message is answered and the socket stays open.
	_ = client.SetReadDeadline(time.Now().Add(waitLimit))
	for i := range protocol.MaxBadMessages {
		if err := client.WriteMessage(websocket.TextMessage, []byte("nope")); err != nil {
			t.Fatalf("write bad message %d: %v", i+1, err)
		}
		_, reply, err := client.ReadMessage()
		if err != nil {
			t.Fatalf("reply to bad message %d: got %v, want an error message", i+1, err)
		}
		m, err := protocol.Decode(reply)
		if e, ok := m.(*protocol.Error); err != nil || !ok || e.Code != protocol.ErrBadJSON {
			t.Fatalf("reply to bad message %d: %s, want an error with code %s", i+1, reply, protocol.ErrBadJSON)
		}
	}
	// One more within the minute closes with 1008.
	if err := client.WriteMessage(websocket.TextMessage, []byte("nope")); err != nil {
		t.Fatalf("write bad message %d: %v", protocol.MaxBadMessages+1, err)
	}
	frames, ce := readUntilClose(t, client)
	if ce.Code != protocol.ClosePolicyViolation || len(frames) != 0 {
		t.Fatalf("after bad message %d: %d frames and close %d (%q), want close %d at once",
			protocol.MaxBadMessages+1, len(frames), ce.Code, ce.Text, protocol.ClosePolicyViolation)
	}
	if err := <-reportErr; err == nil {
		t.Fatal("ReportBad returned nil for the bad message over the budget, want an error")
	}
}

func TestOversizedBinaryFrameCloses1009(t *testing.T) {
	readErr := make(chan error, 1)
	client := serve(t, socket.Options{}, func(ctx context.Context, c *socket.Conn) {
		_, _, err := c.Read()
		readErr <- err
	})
	chunk, err := protocol.EncodeChunk([32]byte{9}, 0, make([]byte, protocol.MaxChunkPayload))
	if err != nil {
		t.Fatal(err)
	}
	// One byte more than the largest chunk frame.
	if err := client.WriteMessage(websocket.BinaryMessage, append(chunk, 0)); err != nil {
		t.Fatalf("write: %v", err)
	}
	if _, ce := readUntilClose(t, client); ce.Code != websocket.CloseMessageTooBig {
		t.Fatalf("close code %d (%q), want %d", ce.Code, ce.Text, websocket.CloseMessageTooBig)
	}
	if code := socket.CloseCode(<-readErr); code != websocket.CloseMessageTooBig {
		t.Fatalf("server Read ended with close code %d, want %d", code, websocket.CloseMessageTooBig)
	}
}

func TestCloseDeliversCodeAndClippedReason(t *testing.T) {
	long := strings.Repeat("é", 100) // 200 bytes, over what a close frame carries
	for _, tc := range []struct{ name, reason, want string }{
		{"short", "replaced", "replaced"},
		{"long", long, strings.Repeat("é", 61)}, // 122 bytes: 123 would split a character
	} {
		t.Run(tc.name, func(t *testing.T) {
			sendErr := make(chan error, 1)
			client := serve(t, socket.Options{}, func(ctx context.Context, c *socket.Conn) {
				c.Close(protocol.CloseReplaced, tc.reason)
				<-c.Done()
				sendErr <- c.Send(ctx, protocol.Capacity{})
				_, _, _ = c.Read() // sees the client's answering close
			})
			_, ce := readUntilClose(t, client)
			if ce.Code != protocol.CloseReplaced || ce.Text != tc.want || !utf8.ValidString(ce.Text) {
				t.Fatalf("close %d %q, want %d %q", ce.Code, ce.Text, protocol.CloseReplaced, tc.want)
			}
			if err := <-sendErr; !errors.Is(err, socket.ErrClosed) {
				t.Fatalf("Send after Close: got %v, want ErrClosed", err)
			}
		})
	}
}

func TestRunCancelClosesGoingAway(t *testing.T) {
	client := serve(t, socket.Options{}, func(ctx context.Context, c *socket.Conn) {
		// Returning makes serve cancel the writer's context.
	})
	if _, ce := readUntilClose(t, client); ce.Code != websocket.CloseGoingAway {
		t.Fatalf("close code %d (%q), want %d", ce.Code, ce.Text, websocket.CloseGoingAway)
	}
}

// TestControlFramesBeforeBulk queues bundle chunks and then a control message before the writer
// starts: the control message must be written first.
func TestControlFramesBeforeBulk(t *testing.T) {
	up := websocket.Upgrader{Subprotocols: []string{protocol.Subprotocol}}
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(done)
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			t.Errorf("upgrade: %v", err)
			return
		}
		c := socket.New(ws, socket.Options{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for i := range 4 {
			if err := c.SendBinary(ctx, []byte{protocol.ChunkTag, byte(i)}); err != nil {
				t.Errorf("SendBinary: %v", err)
			}
		}
		if err := c.Send(ctx, protocol.Ack{Job: "j1", Seq: 1}); err != nil {
			t.Errorf("Send: %v", err)
		}
		go func() { _, _, _ = c.Read() }() // answers the client's close; ends with the conn
		_ = c.Run(ctx)
	}))
	defer srv.Close()
	d := websocket.Dialer{Subprotocols: []string{protocol.Subprotocol}}
	client, resp, err := d.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	_ = resp.Body.Close()
	_ = client.SetReadDeadline(time.Now().Add(waitLimit))
	kind, data, err := client.ReadMessage()
	if err != nil || kind != websocket.TextMessage {
		t.Fatalf("first frame: kind %d %q err %v, want the text ack", kind, data, err)
	}
	for i := range 4 {
		kind, data, err := client.ReadMessage()
		if err != nil || kind != websocket.BinaryMessage || data[1] != byte(i) {
			t.Fatalf("frame %d after the ack: kind %d %v err %v, want binary chunk %d", i+2, kind, data, err, i)
		}
	}
	_ = client.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	_ = client.Close()
	<-done
}

// TestBadMessageWindowSlides checks that bad messages older than the window no longer count.
func TestBadMessageWindowSlides(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	client := serve(t, socket.Options{Now: clock}, func(ctx context.Context, c *socket.Conn) {
		for {
			if _, _, err := c.Read(); err != nil {
				return
			}
			if err := c.ReportBad(ctx, protocol.Error{Code: protocol.ErrBadJSON, Message: "not JSON"}); err != nil {
				return
			}
		}
	})
	_ = client.SetReadDeadline(time.Now().Add(waitLimit))
	for round := range 2 {
		for i := range protocol.MaxBadMessages {
			if err := client.WriteMessage(websocket.TextMessage, []byte("nope")); err != nil {
				t.Fatalf("round %d: write bad message %d: %v", round+1, i+1, err)
			}
			if _, _, err := client.ReadMessage(); err != nil {
				t.Fatalf("round %d: reply to bad message %d: got %v, want an error message (the window should have moved on)", round+1, i+1, err)
			}
		}
		mu.Lock()
		now = now.Add(protocol.BadMessageWindow)
		mu.Unlock()
	}
}

// TestOversizedTextFrameKeepsSocket checks a text frame over the message limit comes back cut,
// for the decoder to answer too_large, and that the socket stays usable.
func TestOversizedTextFrameKeepsSocket(t *testing.T) {
	if raceEnabled {
		t.Skip("16 MiB frames take seconds under -race and the path is single-goroutine; run without -race")
	}
	lengths := make(chan int, 2)
	client := serve(t, socket.Options{}, func(ctx context.Context, c *socket.Conn) {
		for {
			_, data, err := c.Read()
			if err != nil {
				return
			}
			lengths <- len(data)
		}
	})
	big := bytes.Repeat([]byte("x"), protocol.MaxMessageBytes+1000)
	for _, msg := range [][]byte{big, []byte(`{"type":"ack","job":"j","seq":1}`)} {
		if err := client.WriteMessage(websocket.TextMessage, msg); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	for i, want := range []int{protocol.MaxMessageBytes + 1, 32} {
		select {
		case got := <-lengths:
			if got != want {
				t.Fatalf("frame %d: Read returned %d bytes, want %d", i+1, got, want)
			}
		case <-time.After(waitLimit):
			t.Fatalf("frame %d: Read returned nothing; the oversized text frame should not end the socket", i+1)
		}
	}
	if _, err := protocol.Decode(big[:protocol.MaxMessageBytes+1]); err == nil || !strings.Contains(err.Error(), protocol.ErrTooLarge) {
		t.Fatalf("Decode of the cut frame: %v, want %s", err, protocol.ErrTooLarge)
	}
}
