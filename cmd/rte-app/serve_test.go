package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
	"github.com/rte-project/rte/internal/refapp/cli"
	"github.com/rte-project/rte/internal/refapp/refapptest"
	"github.com/rte-project/rte/internal/refapp/server"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

func TestServeRefusesBadSettings(t *testing.T) {
	var stdout, stderr refapptest.SyncBuffer
	code := run(context.Background(), []string{"serve"}, []string{"LOG_LEVEL=loud"}, &stdout, &stderr)
	if code != cli.ExitUsage || !strings.Contains(stderr.String(), "the settings have 2 problem(s); nothing was started") ||
		!strings.Contains(stderr.String(), "APP_ADMIN_TOKEN") || !strings.Contains(stderr.String(), "LOG_LEVEL") {
		t.Errorf("serve with bad settings: exit %d, want %d listing both problems:\n%s", code, cli.ExitUsage, stderr.String())
	}
}

// TestServeRunsUntilCanceled runs `rte-app serve` as main does: it listens, answers the admin
// API, and stops cleanly when its context ends (what SIGTERM does in main).
func TestServeRunsUntilCanceled(t *testing.T) {
	env := []string{
		"APP_ADMIN_TOKEN=" + refapptest.AdminToken, "APP_LISTEN=127.0.0.1:0",
		"APP_DB=" + filepath.Join(t.TempDir(), "app.db"), "APP_NODE=test-node",
	}
	logs := &refapptest.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"serve"}, env, &refapptest.SyncBuffer{}, logs) }()

	var listen string
	started := testenv.Poll(30*time.Second, func() bool {
		sc := bufio.NewScanner(strings.NewReader(logs.String()))
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == server.StartMessage {
				listen, _ = m["listen"].(string)
			}
		}
		if listen != "" {
			return true
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited with %d before listening:\n%s", code, logs.String())
		default:
		}
		return false
	})
	if !started {
		t.Fatalf("serve logged no start line:\n%s", logs.String())
	}
	req, _ := http.NewRequest("GET", "http://"+listen+"/api/v2/runners", nil)
	req.Header.Set("Authorization", "Bearer "+refapptest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /api/v2/runners: %d, want 200", resp.StatusCode)
	}
	cancel()
	select {
	case code := <-done:
		if code != cli.ExitOK || !strings.Contains(logs.String(), "rte-app stopped") {
			t.Errorf("serve after cancel: exit %d, want 0 and \"rte-app stopped\":\n%s", code, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop after its context ended")
	}
	if strings.Contains(logs.String(), refapptest.AdminToken) {
		t.Errorf("the admin token reached the log:\n%s", logs.String())
	}
}

// TestServeAppliesSeed: `rte-app serve` with APP_SEED adds the seeded runners before it serves.
func TestServeAppliesSeed(t *testing.T) {
	db := filepath.Join(t.TempDir(), "app.db")
	seed := filepath.Join(t.TempDir(), "seed.yml")
	if err := os.WriteFile(seed, []byte("runners:\n  - name: rte-old\n    rte_mode: database\n    token: ${OLD_TOKEN}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"APP_ADMIN_TOKEN=" + refapptest.AdminToken, "APP_LISTEN=127.0.0.1:0", "APP_DB=" + db, "APP_NODE=seed-node",
		"APP_SEED=" + seed, "OLD_TOKEN=" + seedToken, "APP_SECRET_KEY=" + strings.Repeat("k", 40),
	}
	logs := &refapptest.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"serve"}, env, &refapptest.SyncBuffer{}, logs) }()
	started := testenv.Poll(30*time.Second, func() bool {
		select {
		case code := <-done:
			t.Fatalf("serve exited with %d:\n%s", code, logs.String())
		default:
		}
		return strings.Contains(logs.String(), server.StartMessage)
	})
	if !started {
		t.Fatalf("serve did not start within 30s:\n%s", logs.String())
	}
	store, err := sqlitestore.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	r, err := store.GetRunner(context.Background(), "rte-old")
	if err != nil || r.Mode != app.ModeDatabase || !r.Seeded || r.TokenFingerprint != protocol.TokenFingerprint(seedToken) {
		t.Fatalf("seeded runner %+v (%v), want database mode, seeded, with the token from OLD_TOKEN", r, err)
	}
	cancel()
	if code := <-done; code != cli.ExitOK {
		t.Fatalf("serve exited %d, want 0:\n%s", code, logs.String())
	}
	for _, secret := range []string{seedToken, strings.Repeat("k", 40)} {
		if strings.Contains(logs.String(), secret) {
			t.Fatalf("a secret reached the log:\n%s", logs.String())
		}
	}
}

// seedToken is the seeded runner's token, which must not reach the log.
const seedToken = "seeded-runner-token-0123456789"
