package rte

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rte-project/rte/internal/config"
)

func TestAppProxyHonoursNoProxy(t *testing.T) {
	const proxy = "http://proxy.example.com:3128"
	s := &config.Settings{HTTPSProxy: proxy, NoProxy: "app.internal,.corp.example"}
	pick := appProxy(s)
	for target, want := range map[string]string{
		"https://forms.example.com/api/v2/rte/socket": proxy,
		"http://forms.example.com/api/v2/rte/socket":  proxy,
		"https://app.internal/api/v2/rte/socket":      "",
		"https://forms.corp.example:8443/":            "",
		"https://127.0.0.1:8443/":                     "", // loopback is never proxied
	} {
		u, _ := url.Parse(target)
		got, err := pick(&http.Request{URL: u})
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		if (got == nil && want != "") || (got != nil && got.String() != want) {
			t.Errorf("%s goes through %v, want %q", target, got, want)
		}
	}
}

func TestAppTLSConfig(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		s      config.Settings
		errHas string
	}{
		{"missing CA file", config.Settings{AppTLSVerify: true, ExtraCACerts: filepath.Join(dir, "gone.pem")}, "NODE_EXTRA_CA_CERTS"},
		{"not PEM", config.Settings{AppTLSVerify: true, ExtraCACerts: notPEM}, "holds no PEM certificate"},
	} {
		if _, err := appTLSConfig(&c.s); err == nil || !strings.Contains(err.Error(), c.errHas) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.errHas)
		}
	}
	// With verification off the CA file is not used (the start warns), so a missing one is no
	// reason to refuse the start.
	cfg, err := appTLSConfig(&config.Settings{AppTLSVerify: false, ExtraCACerts: filepath.Join(dir, "gone.pem")})
	if err != nil || !cfg.InsecureSkipVerify {
		t.Fatalf("APP_TLS_VERIFY=0: %+v, %v; want verification off and no error", cfg, err)
	}
	cfg, err = appTLSConfig(&config.Settings{AppTLSVerify: true})
	if err != nil || cfg.InsecureSkipVerify || cfg.RootCAs != nil {
		t.Fatalf("defaults: %+v, %v; want the system roots, verified", cfg, err)
	}
}
