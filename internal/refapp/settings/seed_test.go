package settings

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rte-project/rte/internal/config"
)

const seedRunnerToken = "seeded-runner-token-0123456789"

func writeSeed(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "seed.yml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSeedSettings: APP_SEED is read with the settings, its ${VAR}s from the same environment,
// and each of its problems is listed beside the other settings'.
func TestSeedSettings(t *testing.T) {
	good := writeSeed(t, "runners:\n  - name: rte-dmz\n    rte_mode: outbound\n    token: ${DMZ_TOKEN}\n")
	s, err := Load([]string{"APP_ADMIN_TOKEN=" + goodAdminToken, "APP_SEED=" + good, "DMZ_TOKEN=" + seedRunnerToken}, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	if s.seed == nil || len(s.seed.seed.Runners) != 1 || s.seed.seed.Runners[0].Token != seedRunnerToken {
		t.Fatalf("the seed was not read with its variable expanded: %+v", s.seed)
	}

	bad := writeSeed(t, "runners:\n  - name: a\n    token: ${NOT_SET}\n  - name: b\n    rte_mode: ftp\n    token: "+seedRunnerToken+"\n")
	cases := []struct {
		name string
		env  []string
		want []string
	}{
		{"seed missing", []string{"APP_SEED=/nonexistent/seed.yml"}, []string{"APP_SEED: read config seed: open /nonexistent/seed.yml"}},
		{"seed with problems", []string{"APP_SEED=" + bad, "LOG_LEVEL=loud"}, []string{
			"APP_SEED: " + bad + " line 3: token: variable NOT_SET is not set",
			"APP_SEED: " + bad + ` line 2: runner "a": url is required`,
			"APP_SEED: " + bad + ` line 5: runner "b": rte_mode "ftp" is not inbound, outbound or database`,
			"LOG_LEVEL:",
		}},
		{"secret key short", []string{"APP_SECRET_KEY=short-key"}, []string{"APP_SECRET_KEY: is 9 characters; use at least 32"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(append([]string{"APP_ADMIN_TOKEN=" + goodAdminToken}, tc.env...), "host-a")
			var se *config.Problems
			if !errors.As(err, &se) {
				t.Fatalf("got %v, want a settings error", err)
			}
			if len(se.List) != len(tc.want) {
				t.Errorf("got %d problems, want %d:\n%s", len(se.List), len(tc.want), err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the problems do not say %q:\n%s", w, err)
				}
			}
			if strings.Contains(err.Error(), seedRunnerToken) || strings.Contains(err.Error(), "short-key") {
				t.Errorf("a problem shows a secret:\n%s", err)
			}
		})
	}
}
