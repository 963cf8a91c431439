package app_test

import (
	"path/filepath"
	"testing"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
	"github.com/rte-project/rte/app/storetest"
)

// storeImpls is the app.Store of this module that need no server; each passes the conformance
// suite (package storetest), and the App's own tests run on each. Package pgstore runs the same
// suite on PostgreSQL.
var storeImpls = []struct {
	name string
	// open returns a fresh, empty store and the directory of its files ("" in memory).
	open func(t *testing.T) (app.Store, string)
}{
	{"memory", func(*testing.T) (app.Store, string) { return app.NewMemoryStore(), "" }},
	{"sqlite", func(t *testing.T) (app.Store, string) {
		dir := t.TempDir()
		s, err := sqlitestore.Open(filepath.Join(dir, "app.db"))
		if err != nil {
			t.Fatalf("open sqlite store: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s, dir
	}},
}

func TestStoreConformance(t *testing.T) {
	for _, impl := range storeImpls {
		t.Run(impl.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) app.Store {
				s, _ := impl.open(t)
				return s
			})
		})
	}
}
