package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

// BenchmarkPinnedHandshake measures what the app pays to (re)connect an inbound RTE: TCP, TLS
// with the pin check, the WebSocket upgrade with the token, and hello/welcome, against the real
// rte binary on loopback.
func BenchmarkPinnedHandshake(b *testing.B) {
	dir := b.TempDir()
	port := freePort(b)
	rte := startRTE(b, dir, port, "HTTPS=1", "RTE_TOKEN="+testToken, "LOG_LEVEL=warn")
	der, err := pinning.LoadCertificateFile(filepath.Join(dir, "certificates", "cert.pem"))
	if err != nil {
		b.Fatal(err)
	}
	_ = rte
	store := app.NewMemoryStore()
	a, err := app.New(app.Config{Store: store, Node: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := a.AddRunner(ctx, &app.Runner{Name: "bench", URL: fmt.Sprintf("https://127.0.0.1:%d", port),
		Mode: protocol.ModeInbound, Token: testToken, CertificateSHA256: protocol.CertificateSHA256(der)}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		peer, err := a.Connect(cctx, "bench")
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		peer.Conn.Close(websocket.CloseNormalClosure, "bench")
	}
}
