package sqlitestore

import (
	"context"
	"path/filepath"
	"testing"
)

// TestDurabilitySettings checks, on several pooled connections at once, the settings the
// exactly-once promise rests on: an ack is sent after a commit that synced the log.
func TestDurabilitySettings(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	// Holding connections open forces the pool to open new ones, each of which must carry
	// the settings.
	for i := range 3 {
		conn, err := s.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for _, p := range []struct {
			pragma string
			want   string
		}{
			{"journal_mode", "wal"},
			{"synchronous", "2"}, // FULL
			{"busy_timeout", "10000"},
			{"page_size", "16384"},
			{"wal_autocheckpoint", "4096"},
		} {
			var got string
			if err := conn.QueryRowContext(ctx, "PRAGMA "+p.pragma).Scan(&got); err != nil || got != p.want {
				t.Errorf("connection %d: PRAGMA %s is %q (%v), want %q", i, p.pragma, got, err, p.want)
			}
		}
	}
}
