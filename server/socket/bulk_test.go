package socket_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/socket"
)

// TestSendAfterBinaryKeepsItsPlace queues chunks, then a bundle.end behind them, then an ack:
// the ack overtakes everything, and bundle.end stays behind the chunks it ends.
func TestSendAfterBinaryKeepsItsPlace(t *testing.T) {
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
		for i := range 3 {
			if err := c.SendBinary(ctx, []byte{protocol.ChunkTag, byte(i)}); err != nil {
				t.Errorf("SendBinary: %v", err)
			}
		}
		if err := c.SendAfterBinary(ctx, protocol.BundleEnd{Hash: "sha256:" + strings.Repeat("a", 64), Size: 3}); err != nil {
			t.Errorf("SendAfterBinary: %v", err)
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
	var got []string
	for range 5 {
		kind, data, err := client.ReadMessage()
		if err != nil {
			t.Fatalf("read after %v: %v", got, err)
		}
		if kind == websocket.BinaryMessage {
			got = append(got, "chunk")
			continue
		}
		m, err := protocol.Decode(data)
		if err != nil {
			t.Fatalf("decode %s: %v", data, err)
		}
		got = append(got, m.Type())
	}
	if want := "ack chunk chunk chunk bundle.end"; strings.Join(got, " ") != want {
		t.Fatalf("frames in the order %v, want %s", got, want)
	}
	_ = client.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	_ = client.Close()
	<-done
}
