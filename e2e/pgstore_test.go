package e2e

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rte-project/rte/app/pgstore/pgtest"
)

// One PostgreSQL server for the package, started by the first test that needs it and stopped
// by TestMain (stopPostgres); each test gets a database of its own.
var (
	pgOnce    sync.Once
	pgServer  *pgtest.Server
	pgMissing error
)

// postgres returns the package's server, or skips the test when the binaries are missing.
func postgres(t *testing.T) *pgtest.Server {
	t.Helper()
	pgOnce.Do(func() { pgServer, pgMissing = pgtest.Start() })
	if errors.Is(pgMissing, pgtest.ErrMissing) {
		t.Skipf("no PostgreSQL to test on: %v", pgMissing)
	}
	if pgMissing != nil {
		t.Fatalf("start PostgreSQL: %v", pgMissing)
	}
	return pgServer
}

func stopPostgres() {
	if pgServer != nil {
		pgServer.Stop()
	}
}

func pgDatabase(t *testing.T, srv *pgtest.Server) string {
	t.Helper()
	url, err := srv.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return url
}

// TestNodesServeKilledPostgres: two `rte-app serve` processes on one PostgreSQL database, a
// real RTE and a real playbook printing 25,000 lines; the node holding the RTE's socket is
// SIGKILLed mid-job, the other takes the lease once it expired, and every line is stored once.
func TestNodesServeKilledPostgres(t *testing.T) {
	nodesServeKilled(t, pgDatabase(t, postgres(t)))
}

// TestNodesCutOffFromPostgres: two nodes, each reaching PostgreSQL through a proxy of its own.
// The proxy of the node holding the RTE's socket is cut mid-job: that node's /ready turns 503
// saying the database does not answer, it cannot renew its lease, and the other node takes the
// runner once the lease expired. Every line is stored once, the records the cut node received
// but could not store included, since it never acked them.
func TestNodesCutOffFromPostgres(t *testing.T) {
	srv := postgres(t)
	db := pgDatabase(t, srv)
	nodes := map[string]*refApp{}
	proxies := map[string]*pgtest.Proxy{}
	for _, node := range []string{"e2e-node-a", "e2e-node-b"} {
		p, err := srv.Proxy()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Cut)
		proxies[node] = p
		nodes[node] = startRefApp(t, "APP_DB="+p.URL(db), "APP_NODE="+node, "RTE_JOIN_TOKEN="+joinToken)
		if status, body := nodes[node].call(t, http.MethodGet, "/ready", ""); status != http.StatusOK {
			t.Fatalf("node %s /ready: %d %s, want 200 with its database reachable", node, status, body)
		}
	}
	cut := ""
	nodesTakeover(t, nodes["e2e-node-a"], nodes["e2e-node-b"], "cut off from PostgreSQL", func(victim string) {
		cut = victim
		proxies[victim].Cut()
		deadline := time.Now().Add(30 * time.Second)
		for {
			status, body := nodes[victim].call(t, http.MethodGet, "/ready", "")
			if status == http.StatusServiceUnavailable && strings.Contains(string(body), "does not answer") {
				t.Logf("%s /ready: %s", victim, strings.TrimSpace(string(body)))
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s /ready is %d %s 30s after its database was cut off, want 503 saying the database does not answer", victim, status, body)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	for node, ref := range nodes {
		if node == cut {
			continue
		}
		if status, body := ref.call(t, http.MethodGet, "/ready", ""); status != http.StatusOK {
			t.Errorf("the surviving node %s /ready: %d %s, want 200", node, status, body)
		}
	}
}
