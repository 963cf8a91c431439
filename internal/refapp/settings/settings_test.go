package settings

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/internal/config"
)

const goodAdminToken = "0123456789abcdef-admin"

func TestSettingsDefaults(t *testing.T) {
	s, err := Load([]string{"APP_ADMIN_TOKEN=" + goodAdminToken, "UNRELATED=1"}, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	want := Settings{
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
	s, err := Load([]string{
		"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_LISTEN=:9090", "APP_DB=/var/lib/rte-app/app.db",
		"APP_NODE=app-2", "RTE_JOIN_TOKEN=join-token-0123456789", "RTE_QUEUE_MINUTES=5",
		"RTE_FILES_MAX_MB=64", "LOG_LEVEL=DEBUG", "LOG_FORMAT=console",
		// Set but empty counts as unset: the default stays.
		"APP_DB=",
	}, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	want := Settings{
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
		{"inventory without playbooks", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_INVENTORY_PATH=."}, []string{"APP_INVENTORY_PATH: is set without APP_PLAYBOOKS_PATH"}},
		{"log level", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "LOG_LEVEL=loud"}, []string{`LOG_LEVEL: "loud" is not debug`}},
		{"log format", []string{"APP_ADMIN_TOKEN=" + goodAdminToken, "LOG_FORMAT=xml"}, []string{`LOG_FORMAT: "xml" is not json or console`}},
		{"every problem at once", []string{"RTE_QUEUE_MINUTES=x", "RTE_FILES_MAX_MB=y", "LOG_FORMAT=xml", "APP_LISTEN=nope"},
			[]string{"APP_ADMIN_TOKEN:", "RTE_QUEUE_MINUTES:", "RTE_FILES_MAX_MB:", "LOG_FORMAT:", "APP_LISTEN:"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Load(tc.env, "host-a")
			var se *config.Problems
			if !errors.As(err, &se) {
				t.Fatalf("Load(%q) = %+v, %v; want a settings error", tc.env, s, err)
			}
			if len(se.List) != len(tc.want) {
				t.Errorf("got %d problems, want %d:\n%s", len(se.List), len(tc.want), err)
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
	s := Settings{AdminToken: goodAdminToken, JoinToken: "join-token-0123456789"}
	b, _ := json.Marshal(s)
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%+v %#v %s %q", s, s, s.AdminToken, s.JoinToken), string(b)} {
		if strings.Contains(out, goodAdminToken) || strings.Contains(out, "join-token") {
			t.Errorf("a token printed: %s", out)
		}
	}
}
