package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const goodAdminToken = "0123456789abcdef-admin"

func TestSettingsDefaults(t *testing.T) {
	s, err := loadSettings([]string{"APP_ADMIN_TOKEN=" + goodAdminToken, "UNRELATED=1"}, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	want := settings{
		Listen: "127.0.0.1:8080", DB: "rte-app.db", Node: "host-a", AdminToken: goodAdminToken,
		QueueMinutes: 60, FilesMaxMB: 512, BundleCacheMB: 2048, LogLevel: "info", LogFormat: "json",
	}
	if *s != want {
		t.Errorf("defaults = %+v, want %+v", *s, want)
	}
	if s.QueueTimeout() != time.Hour {
		t.Errorf("QueueTimeout = %s, want 1h", s.QueueTimeout())
	}
}

func TestSettingsValues(t *testing.T) {
	s, err := loadSettings([]string{
		"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_LISTEN=:9090", "APP_DB=/var/lib/rte-app/app.db",
		"APP_NODE=app-2", "RTE_JOIN_TOKEN=join-token-0123456789", "RTE_QUEUE_MINUTES=5",
		"RTE_FILES_MAX_MB=64", "LOG_LEVEL=DEBUG", "LOG_FORMAT=console",
		// Set but empty counts as unset: the default stays.
		"APP_DB=",
	}, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	want := settings{
		Listen: ":9090", DB: "rte-app.db", Node: "app-2", AdminToken: goodAdminToken, JoinToken: "join-token-0123456789",
		QueueMinutes: 5, FilesMaxMB: 64, BundleCacheMB: 2048, LogLevel: "debug", LogFormat: "console",
	}
	if *s != want {
		t.Errorf("settings = %+v, want %+v", *s, want)
	}
}

func TestSettingsRefusals(t *testing.T) {
	cases := []struct {
		name string
		env  []string
		want []string // every one must be reported
	}{
		{"admin token missing", nil, []string{"APP_ADMIN_TOKEN: is required"}},
		{"admin token short", []string{"APP_ADMIN_TOKEN=short"}, []string{"APP_ADMIN_TOKEN: is 5 characters; use at least 16"}},
		{"admin token with a space", []string{"APP_ADMIN_TOKEN=0123456789 abcdefgh"}, []string{"APP_ADMIN_TOKEN: holds spaces or control characters"}},
		{"join token short", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "RTE_JOIN_TOKEN=abc"}, []string{"RTE_JOIN_TOKEN: is 3 characters"}},
		{"listen without port", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_LISTEN=localhost"}, []string{`APP_LISTEN: "localhost" is not host:port`}},
		{"listen bad port", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_LISTEN=127.0.0.1:http"}, []string{`APP_LISTEN: port "http"`}},
		{"listen port too big", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_LISTEN=127.0.0.1:70000"}, []string{`APP_LISTEN: port "70000"`}},
		{"blank db", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_DB=  "}, []string{"APP_DB: is empty"}},
		{"node with a newline", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_NODE=a\nb"}, []string{"APP_NODE:"}},
		{"queue not a number", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "RTE_QUEUE_MINUTES=soon"}, []string{`RTE_QUEUE_MINUTES: "soon" is not a whole number; the default is 60`}},
		{"queue zero", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "RTE_QUEUE_MINUTES=0"}, []string{"RTE_QUEUE_MINUTES: is 0"}},
		{"files max negative", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "RTE_FILES_MAX_MB=-1"}, []string{"RTE_FILES_MAX_MB: is -1"}},
		{"bundle cache zero", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_BUNDLE_CACHE_MB=0"}, []string{"APP_BUNDLE_CACHE_MB: is 0"}},
		{"playbooks path missing", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_PLAYBOOKS_PATH=/nonexistent/playbooks"}, []string{`APP_PLAYBOOKS_PATH: "/nonexistent/playbooks" cannot be read`}},
		{"playbooks path a file", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_PLAYBOOKS_PATH=settings.go"}, []string{`APP_PLAYBOOKS_PATH: "settings.go" is not a directory`}},
		{"inventory without playbooks", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_INVENTORY_PATH=testdata"}, []string{"APP_INVENTORY_PATH: is set without APP_PLAYBOOKS_PATH"}},
		{"log level", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "LOG_LEVEL=loud"}, []string{`LOG_LEVEL: "loud" is not debug`}},
		{"log format", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "LOG_FORMAT=xml"}, []string{`LOG_FORMAT: "xml" is not json or console`}},
		{"every problem at once", []string{"RTE_QUEUE_MINUTES=x", "RTE_FILES_MAX_MB=y", "LOG_FORMAT=xml", "APP_LISTEN=nope"},
			[]string{"APP_ADMIN_TOKEN:", "RTE_QUEUE_MINUTES:", "RTE_FILES_MAX_MB:", "LOG_FORMAT:", "APP_LISTEN:"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := loadSettings(tc.env, "host-a")
			var se *settingsError
			if !errors.As(err, &se) {
				t.Fatalf("loadSettings(%q) = %+v, %v; want a settings error", tc.env, s, err)
			}
			if len(se.problems) != len(tc.want) {
				t.Errorf("got %d problems, want %d:\n%s", len(se.problems), len(tc.want), err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the problems do not say %q:\n%s", w, err)
				}
			}
			if strings.Contains(err.Error(), goodAdminToken) {
				t.Errorf("a problem shows the admin token:\n%s", err)
			}
		})
	}
}

func TestSecretNeverPrints(t *testing.T) {
	s := settings{AdminToken: goodAdminToken, JoinToken: "join-token-0123456789"}
	b, _ := json.Marshal(s)
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%+v %#v %s %q", s, s, s.AdminToken, s.JoinToken), string(b)} {
		if strings.Contains(out, goodAdminToken) || strings.Contains(out, "join-token") {
			t.Errorf("a token printed: %s", out)
		}
	}
}

func TestServeRefusesBadSettings(t *testing.T) {
	var stdout, stderr syncBuffer
	code := run(context.Background(), []string{"serve"}, []string{"LOG_LEVEL=loud"}, &stdout, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "the settings have 2 problem(s); nothing was started") ||
		!strings.Contains(stderr.String(), "APP_ADMIN_TOKEN") || !strings.Contains(stderr.String(), "LOG_LEVEL") {
		t.Errorf("serve with bad settings: exit %d, want %d listing both problems:\n%s", code, exitUsage, stderr.String())
	}
}

// TestServeRunsUntilCanceled runs `rte-app serve` as main does: it listens, answers the admin
// API, and stops cleanly when its context ends (what SIGTERM does in main).
func TestServeRunsUntilCanceled(t *testing.T) {
	env := []string{
		"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_LISTEN=127.0.0.1:0",
		"APP_DB=" + filepath.Join(t.TempDir(), "app.db"), "APP_NODE=test-node",
	}
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"serve"}, env, &syncBuffer{}, logs) }()

	var listen string
	deadline := time.After(30 * time.Second)
	for listen == "" {
		sc := bufio.NewScanner(strings.NewReader(logs.String()))
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == startMessage {
				listen, _ = m["listen"].(string)
			}
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited with %d before listening:\n%s", code, logs.String())
		case <-deadline:
			t.Fatalf("serve logged no start line:\n%s", logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	req, _ := http.NewRequest("GET", "http://"+listen+"/api/v2/runners", nil)
	req.Header.Set("Authorization", "Bearer "+goodAdminToken)
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
		if code != exitOK || !strings.Contains(logs.String(), "rte-app stopped") {
			t.Errorf("serve after cancel: exit %d, want 0 and \"rte-app stopped\":\n%s", code, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop after its context ended")
	}
	if strings.Contains(logs.String(), goodAdminToken) {
		t.Errorf("the admin token reached the log:\n%s", logs.String())
	}
}
