package app_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/apptest"
	"github.com/rte-project/rte/protocol"
)

const (
	seedToken1 = "seed-token-one-0123456789"
	seedToken2 = "seed-token-two-0123456789"
)

// env is a lookup over a table, as os.LookupEnv is over the environment.
func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestParseSeed(t *testing.T) {
	sha := strings.Repeat("AB", 32)
	seed, err := app.ParseSeed("seed.yml", []byte(`
runners:
  - name: rte01
    url: https://rte01.example.com:8000
    token: ${RTE01_TOKEN}
    certificate_sha256: `+sha+`
    max_jobs: 4
  - name: rte-dmz
    rte_mode: outbound
    token: "pre$$fix-${DMZ_TOKEN}"
  - name: rte-old
    rte_mode: DATABASE
    token: literal-token-with-$-sign
    url: ~
`), env("RTE01_TOKEN", seedToken1, "DMZ_TOKEN", seedToken2))
	if err != nil {
		t.Fatal(err)
	}
	want := []app.SeedRunner{
		{Name: "rte01", Mode: protocol.ModeInbound, URL: "https://rte01.example.com:8000", Token: seedToken1, CertificateSHA256: strings.ToLower(sha), MaxJobs: 4, Line: 3},
		{Name: "rte-dmz", Mode: protocol.ModeOutbound, Token: "pre$fix-" + seedToken2, Line: 8},
		{Name: "rte-old", Mode: app.ModeDatabase, Token: "literal-token-with-$-sign", Line: 11},
	}
	if seed.Path != "seed.yml" || !reflect.DeepEqual(seed.Runners, want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", seed.Runners, want)
	}
	if seed, err := app.ParseSeed("s", []byte("runners: []\n"), env()); err != nil || len(seed.Runners) != 0 {
		t.Fatalf("an empty list gave %+v, %v; want no runners and no error", seed, err)
	}
}

// TestParseSeedRefusals: every problem of a seed is listed, with its line, and no token's
// value is ever part of one.
func TestParseSeedRefusals(t *testing.T) {
	const secretish = "short-secret"
	tests := []struct {
		name, yaml string
		says       []string
	}{
		{"empty file", "", []string{"line 1: the seed is empty"}},
		{"not yaml", "runners: [", []string{"not YAML"}},
		{"not a mapping", "- name: x\n", []string{"line 1: the seed must be a mapping"}},
		{"no runners key", "other: 1\n", []string{`line 1: unknown key "other"`, "no runners: key"}},
		{"runners not a list", "runners: rte01\n", []string{"line 1: runners: must be a list"}},
		{"runner not a mapping", "runners:\n  - rte01\n", []string{"line 2: a runner must be a mapping"}},
		{"missing variable", "runners:\n  - name: a\n    url: http://h:1\n    token: ${NOPE_TOKEN}\n", []string{"line 4: token: variable NOPE_TOKEN is not set"}},
		{"empty variable", "runners:\n  - name: a\n    url: http://h:1\n    token: ${EMPTY}\n", []string{"variable EMPTY is not set (or empty)"}},
		{"unclosed variable", "runners:\n  - name: a\n    url: http://h:1\n    token: ${OOPS\n", []string{"line 4: token: ${ without a closing }"}},
		{"bad variable name", "runners:\n  - name: a\n    url: http://h:1\n    token: ${1X}\n", []string{"${1X} does not name a variable"}},
		{"unknown key", "runners:\n  - name: a\n    url: http://h:1\n    token: " + seedToken1 + "\n    tokne: x\n", []string{`line 5: unknown key "tokne"`}},
		{"key twice", "runners:\n  - name: a\n    name: b\n    url: http://h:1\n    token: " + seedToken1 + "\n", []string{"line 3: name is given twice (first at line 2)"}},
		{"list value", "runners:\n  - name: [a]\n    token: " + seedToken1 + "\n", []string{"line 2: name must be a single value"}},
		{"no name", "runners:\n  - url: http://h:1\n    token: " + seedToken1 + "\n", []string{"line 2: name is required"}},
		{"short token", "runners:\n  - name: a\n    url: http://h:1\n    token: " + secretish + "\n", []string{`line 4: runner "a": token is 12 characters, at least 16`}},
		{"no token", "runners:\n  - name: a\n    url: http://h:1\n", []string{`runner "a": token is required`}},
		{"bad mode", "runners:\n  - name: a\n    rte_mode: ftp\n    token: " + seedToken1 + "\n", []string{`line 3: runner "a": rte_mode "ftp" is not inbound, outbound or database`}},
		{"inbound without url", "runners:\n  - name: a\n    token: " + seedToken1 + "\n", []string{`line 2: runner "a": url is required`}},
		{"url on outbound", "runners:\n  - name: a\n    rte_mode: outbound\n    url: http://h:1\n    token: " + seedToken1 + "\n", []string{"line 4", "url is for inbound runners only"}},
		{"fingerprint on database", "runners:\n  - name: a\n    rte_mode: database\n    token: " + seedToken1 + "\n    certificate_sha256: " + strings.Repeat("ab", 32) + "\n", []string{"line 5", "certificate_sha256 is for inbound runners only"}},
		{"short fingerprint", "runners:\n  - name: a\n    url: https://h:1\n    token: " + seedToken1 + "\n    certificate_sha256: abcd-ef12\n", []string{"line 5", "64 hex digits"}},
		{"fingerprint on http", "runners:\n  - name: a\n    url: http://h:1\n    token: " + seedToken1 + "\n    certificate_sha256: " + strings.Repeat("ab", 32) + "\n", []string{"not https://"}},
		{"negative max jobs", "runners:\n  - name: a\n    url: http://h:1\n    token: " + seedToken1 + "\n    max_jobs: -2\n", []string{`line 5: runner "a": max_jobs "-2" is not a whole number`}},
		{"duplicate runner", "runners:\n  - name: a\n    url: http://h:1\n    token: " + seedToken1 + "\n  - name: a\n    url: http://h:2\n    token: " + seedToken2 + "\n", []string{`line 5: runner "a" is declared again (first at line 2)`}},
		{"every problem at once", "runners:\n  - name: a\n    token: ${MISSING_A}\n  - name: b\n    rte_mode: outbound\n    url: http://h:1\n    token: " + secretish + "\n",
			[]string{"line 3: token: variable MISSING_A is not set", `line 6: runner "b": url is for inbound runners only`, `runner "b": token is 12 characters`, `runner "a": url is required`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seed, err := app.ParseSeed("/etc/rte-app/seed.yml", []byte(tt.yaml), env("EMPTY", ""))
			var se *app.SeedError
			if !errors.As(err, &se) {
				t.Fatalf("got %+v, %v; want a *SeedError", seed, err)
			}
			all := strings.Join(se.Problems, "\n")
			for _, s := range tt.says {
				if !strings.Contains(all, s) {
					t.Errorf("problems\n%s\ndo not say %q", all, s)
				}
			}
			if strings.Contains(all, secretish) || strings.Contains(all, seedToken1) {
				t.Errorf("a problem shows a token's value:\n%s", all)
			}
			if !strings.Contains(err.Error(), "/etc/rte-app/seed.yml") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

// FuzzParseSeed: whatever the file holds, ParseSeed answers runners that pass its own checks
// or a *SeedError, and never panics.
func FuzzParseSeed(f *testing.F) {
	f.Add([]byte("runners:\n  - name: a\n    url: https://h:1\n    token: ${T}\n    max_jobs: 2\n"))
	f.Add([]byte("runners:\n  - name: b\n    rte_mode: outbound\n    token: $$${T}$\n"))
	f.Add([]byte("runners: [{name: c, rte_mode: database, token: x}]"))
	f.Add([]byte("runners:\n  - &a {name: d}\n  - *a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		seed, err := app.ParseSeed("f.yml", data, env("T", seedToken1))
		if err != nil {
			var se *app.SeedError
			if !errors.As(err, &se) && !strings.Contains(err.Error(), "config seed") {
				t.Fatalf("error %v is not a *SeedError", err)
			}
			return
		}
		for _, r := range seed.Runners {
			if r.Name == "" || len(r.Token) < protocol.MinTokenLength || (r.Mode == protocol.ModeInbound) == (r.URL == "") {
				t.Fatalf("accepted a runner that fails the checks: %+v", r)
			}
		}
	})
}

// seedFile is a seed on disk that a test rewrites; its App reads it through Config.Seed.
type seedFile struct {
	t    *testing.T
	path string
}

func newSeedFile(t *testing.T, text string) *seedFile {
	s := &seedFile{t: t, path: filepath.Join(t.TempDir(), "seed.yml")}
	s.write(text)
	return s
}

func (s *seedFile) write(text string) {
	s.t.Helper()
	if err := os.WriteFile(s.path, []byte(text), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

func (s *seedFile) source(lookup func(string) (string, bool)) func() (*app.Seed, error) {
	return func() (*app.Seed, error) { return app.LoadSeed(s.path, lookup) }
}

func TestApplySeed(t *testing.T) {
	sim := startSim(t, "rte-in", 2, func(c *apptest.Config) { c.Token = seedToken1 })
	sha := protocol.CertificateSHA256(sim.cert.der)
	seed := newSeedFile(t, `
runners:
  - name: rte-in
    url: `+sim.url()+`
    token: ${IN_TOKEN}
    certificate_sha256: `+sha+`
  - name: rte-out
    rte_mode: outbound
    token: ${OUT_TOKEN}
  - name: rte-old
    rte_mode: database
    token: ${OUT_TOKEN}
`)
	lookup := env("IN_TOKEN", seedToken1, "OUT_TOKEN", seedToken2)
	ta := runningApp(t, app.NewMemoryStore(), func(c *app.Config) { c.Seed = seed.source(lookup) })
	ctx := context.Background()
	if err := ta.AddRunner(ctx, &app.Runner{Name: "by-hand", Mode: protocol.ModeOutbound, Token: testToken, Seeded: true}); err != nil {
		t.Fatal(err)
	}
	if err := ta.ApplySeed(ctx); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		name, mode string
		seeded     bool
	}{{"rte-in", protocol.ModeInbound, true}, {"rte-out", protocol.ModeOutbound, true}, {"rte-old", app.ModeDatabase, true}, {"by-hand", protocol.ModeOutbound, false}} {
		r := ta.runner(t, w.name)
		if r.Mode != w.mode || r.Seeded != w.seeded || r.State != app.StateApproved {
			t.Errorf("runner %s: mode %s, seeded %v, %s; want %s, seeded %v, approved", w.name, r.Mode, r.Seeded, r.State, w.mode, w.seeded)
		}
	}
	// The seeded inbound runner's first matching certificate is pinned without an admin.
	ta.start(t)
	ta.waitConnected(t, sim)
	if r := ta.runner(t, "rte-in"); string(r.Certificate) != string(sim.cert.der) {
		t.Fatal("the certificate matching the seed's fingerprint was not pinned")
	}

	// The seed changes: another token and max_jobs, database moves to outbound, one runner
	// leaves the seed.
	seed.write(`
runners:
  - name: rte-in
    url: ` + sim.url() + `
    token: ${IN_TOKEN}
    certificate_sha256: ` + sha + `
    max_jobs: 7
  - name: rte-old
    rte_mode: outbound
    token: ${IN_TOKEN}
`)
	if err := ta.ApplySeed(ctx); err != nil {
		t.Fatal(err)
	}
	if r := ta.runner(t, "rte-in"); r.MaxJobs != 7 || string(r.Certificate) != string(sim.cert.der) {
		t.Errorf("rte-in: max_jobs %d, pinned %v; want 7, and the pin kept", r.MaxJobs, r.Certificate != nil)
	}
	if r := ta.runner(t, "rte-old"); r.Mode != protocol.ModeOutbound || r.TokenFingerprint != protocol.TokenFingerprint(seedToken1) || !r.Seeded {
		t.Errorf("rte-old: %s, token %s, seeded %v; want outbound with the new token, seeded", r.Mode, r.TokenFingerprint, r.Seeded)
	}
	if r := ta.runner(t, "rte-out"); r.Seeded || r.State != app.StateApproved {
		t.Errorf("rte-out left the seed: seeded %v, %s; want unmarked and kept", r.Seeded, r.State)
	}
	assertNoSecretLogged(t, ta.logs, seedToken1, seedToken2)

	// A seed that no longer parses stops ApplySeed with every problem.
	seed.write("runners:\n  - name: x\n    token: ${GONE}\n")
	err := ta.ApplySeed(ctx)
	var se *app.SeedError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "variable GONE is not set") || !strings.Contains(err.Error(), "url is required") {
		t.Fatalf("a bad seed gave %v, want a *SeedError naming both problems", err)
	}
}

// TestDatabaseModeMove: an RTE that signs in over the outbound endpoint with the name and own
// token of a runner still in database mode moves it to outbound, approved, with nothing for an
// admin to do; another token is refused as ever.
func TestDatabaseModeMove(t *testing.T) {
	ta := newTestApp(t, nil)
	ta.start(t)
	ctx := context.Background()
	if err := ta.AddRunner(ctx, &app.Runner{Name: "rte-old", Mode: app.ModeDatabase, Token: testToken}); err != nil {
		t.Fatal(err)
	}
	if _, err := ta.Submit(ctx, app.JobRequest{Runner: "rte-old", JobStart: protocol.JobStart{Playbook: "site.yml"}}); !errors.Is(err, app.ErrRefused) || !strings.Contains(err.Error(), "database mode") {
		t.Fatalf("a job for a database-mode runner got %v, want a refusal naming database mode", err)
	}
	if _, resp, err := dialOut(t, ta, "rte-old", otherToken, ""); err == nil {
		t.Fatal("another token took over a database-mode runner")
	} else if status, _ := refusal(t, resp); status != http.StatusUnauthorized {
		t.Fatalf("another token got %d, want 401", status)
	}

	o := joinOut(t, ta, "rte-old", testToken, "")
	if w := want[*protocol.Welcome](o); !w.Approved {
		t.Fatal("the moved runner was welcomed unapproved")
	}
	r := ta.runner(t, "rte-old")
	if r.Mode != protocol.ModeOutbound || r.State != app.StateApproved {
		t.Fatalf("runner after the move: %s %s, want outbound approved", r.Mode, r.State)
	}
	const msg = "Runner 'rte-old' moved from database mode to outbound: its RTE signed in with the runner's own token."
	if n := ta.logs.FilterMessage(msg).Len(); n != 1 {
		t.Fatalf("logged %q %d times, want once", msg, n)
	}
}

// TestSeedKeepsDatabaseMode: a runner the seed keeps in database mode is refused with the seed's
// path and what to change; once the seed says outbound, the same RTE is taken, without a
// restart of the app.
func TestSeedKeepsDatabaseMode(t *testing.T) {
	seed := newSeedFile(t, "runners:\n  - name: rte-old\n    rte_mode: database\n    token: ${TOKEN}\n")
	ta := newTestApp(t, func(c *app.Config) { c.Seed = seed.source(env("TOKEN", testToken)) })
	ta.start(t)
	if err := ta.ApplySeed(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, resp, err := dialOut(t, ta, "rte-old", testToken, "")
	if err == nil {
		t.Fatal("a runner the seed keeps in database mode was taken")
	}
	status, msg := refusal(t, resp)
	want403 := "runner 'rte-old' is managed by the config seed in database mode: set rte_mode: outbound for it in the seed (" + seed.path + "), then restart this RTE"
	if status != http.StatusForbidden || msg != want403 {
		t.Fatalf("got %d %q, want 403 %q", status, msg, want403)
	}
	if r := ta.runner(t, "rte-old"); r.Mode != app.ModeDatabase {
		t.Fatalf("the refused runner became %s", r.Mode)
	}

	seed.write("runners:\n  - name: rte-old\n    rte_mode: outbound\n    token: ${TOKEN}\n")
	o := joinOut(t, ta, "rte-old", testToken, "")
	if w := want[*protocol.Welcome](o); !w.Approved {
		t.Fatal("the runner the seed moved to outbound was welcomed unapproved")
	}
	if r := ta.runner(t, "rte-old"); r.Mode != protocol.ModeOutbound || !r.Seeded {
		t.Fatalf("runner after the seed changed: %s seeded %v, want outbound and still seeded", r.Mode, r.Seeded)
	}
}
