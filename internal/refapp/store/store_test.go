package store

import (
	"context"
	"strings"
	"testing"
)

// TestDBForLog: APP_DB as logged never carries a password.
func TestDBForLog(t *testing.T) {
	for _, tt := range []struct{ db, want string }{
		{"rte-app.db", "rte-app.db"},
		{"/var/lib/rte-app/app.db", "/var/lib/rte-app/app.db"},
		{"postgres://rte:hunter2@db.example.com:5432/rte?sslmode=verify-full", "postgres://rte:xxxxx@db.example.com:5432/rte?sslmode=verify-full"},
		{"postgresql://db.example.com/rte", "postgresql://db.example.com/rte"},
		{"postgres://rte:hun%zz@db/rte", "postgres://[does not parse]"},
	} {
		if got := ForLog(tt.db); got != tt.want {
			t.Errorf("ForLog(%q) = %q, want %q", tt.db, got, tt.want)
		}
	}
}

// TestOpenStoreChoice: a postgres:// APP_DB goes to PostgreSQL (here one that does not answer,
// which the error says, naming the setting but not the password); anything else is a file.
func TestOpenStoreChoice(t *testing.T) {
	_, _, err := Open(context.Background(), "postgres://rte:hunter2@127.0.0.1:1/rte?connect_timeout=2")
	if err == nil || !strings.Contains(err.Error(), "APP_DB, PostgreSQL") || !strings.Contains(err.Error(), "does not answer") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("opening an unreachable PostgreSQL got %v, want an error naming APP_DB and the server, without the password", err)
	}
	s, closeStore, err := Open(context.Background(), t.TempDir()+"/app.db")
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	if _, err := s.ListRunners(context.Background()); err != nil {
		t.Fatalf("the SQLite store does not answer: %v", err)
	}
}
