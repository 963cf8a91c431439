package config

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"reflect"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/rte-project/rte/protocol"
)

// Warnings is advice about settings that work but are risky or have no effect. The RTE logs
// each at every start, so that a risky choice is not forgotten once made. A variable Load
// refused gets no advice: its value is not used, and the problem already says what to do.
func (s *Settings) Warnings() []string {
	var w []string
	if !s.AppTLSVerify && s.usable("APP_TLS_VERIFY") {
		w = append(w, "APP_TLS_VERIFY=0: the app's certificate is not verified, so anyone on the network path can pose as the app and receive RTE_TOKEN and every job; give the app's CA in NODE_EXTRA_CA_CERTS and set APP_TLS_VERIFY=1")
		if s.ExtraCACerts != "" {
			w = append(w, "NODE_EXTRA_CA_CERTS is not used while APP_TLS_VERIFY=0")
		}
	}
	if s.JoinToken != "" && s.AppURL == "" && s.usable("RTE_JOIN_TOKEN", "APP_URL") {
		w = append(w, "RTE_JOIN_TOKEN is set but APP_URL is not, so this RTE never joins the app and the join token is not used: set APP_URL (and RTE_URL in inbound mode), or remove RTE_JOIN_TOKEN and approve the runner at the app")
	}
	if s.Mode == protocol.ModeOutbound && s.RTEURL != "" && s.usable("RTE_MODE", "RTE_URL") {
		w = append(w, "RTE_URL is not used in outbound mode, where this RTE dials the app: remove it")
	}
	if s.Files == protocol.FilesTransfer && s.usable("RTE_FILES") {
		for _, v := range []struct{ name, value string }{{"ANSIBLE_PATH", s.AnsiblePath}, {"REPO_PATH", s.RepoPath}} {
			if v.value != "" && s.usable(v.name) {
				w = append(w, v.name+" is not used while RTE_FILES=transfer, where the app sends the files with each job: set RTE_FILES=local to run from this directory, or remove "+v.name)
			}
		}
	}
	if s.Mode == protocol.ModeInbound && s.RTEURL != "" && s.usable("RTE_MODE", "RTE_URL", "HTTPS") {
		u, err := url.Parse(s.RTEURL)
		switch {
		case err != nil: // Load refuses it; nothing to add
		case u.Scheme == "https" && !s.HTTPS:
			w = append(w, "RTE_URL is https:// but HTTPS=0: the app dials with TLS, which fails unless a TLS proxy in front of this RTE ends it, and no certificate is sent for the app to pin; set HTTPS=1")
		case u.Scheme == "http" && s.HTTPS:
			w = append(w, "RTE_URL is http:// but HTTPS=1: the app dials without TLS and fails; make RTE_URL https://")
		}
	}
	for _, v := range []struct{ name, value string }{{"APP_URL", s.AppURL}, {"RTE_URL", s.RTEURL}} {
		if v.value == "" || !s.usable(v.name) || (v.name == "RTE_URL" && s.Mode != protocol.ModeInbound) {
			continue
		}
		if u, err := url.Parse(v.value); err == nil && u.Scheme == "http" && !isLoopback(u.Hostname()) {
			w = append(w, v.name+" is http://: RTE_TOKEN and the jobs cross the network unencrypted; use https:// outside a test network")
		}
	}
	return w
}

// usable reports whether Load accepted every one of the variables.
func (s *Settings) usable(names ...string) bool {
	for _, n := range names {
		if s.refused[n] {
			return false
		}
	}
	return true
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Setting is one variable as the RTE uses it. When Secret is true, Value describes the
// variable ("set", "unset", a fingerprint, a URL without its credentials) instead of showing it.
type Setting struct {
	Var    string
	Value  string
	Secret bool
}

// Effective lists every variable with the value in effect, defaults included, in the order
// of docs/settings.md, for the RTE to log at start. It never contains a secret: RTE_TOKEN
// shows as its fingerprint (the one the app shows), other tokens as set or unset, and
// HTTPS_PROXY without its credentials.
func (s *Settings) Effective() []Setting {
	v := reflect.ValueOf(s).Elem()
	out := make([]Setting, 0, len(fields))
	for _, f := range fields {
		st := Setting{Var: f.Var}
		switch x := v.Field(f.Index).Interface().(type) {
		case Secret:
			st.Value, st.Secret = s.describeSecret(f.Var, string(x))
		case string:
			st.Value = x
		case bool:
			st.Value = "0"
			if x {
				st.Value = "1"
			}
		case int:
			st.Value = strconv.Itoa(x)
		case int64:
			st.Value = strconv.FormatInt(x, 10)
		case time.Duration:
			st.Value = x.String()
		default:
			panic("config: Effective cannot show " + f.Name + ": add its type here")
		}
		if raw, ok := s.written[f.Var]; ok && !st.Secret {
			st.Value = Quote(raw) + " (refused: see the problem below)"
		}
		if from := s.source(f.Var); from != f.Var {
			st.Value += " (from " + from + ")"
		}
		out = append(out, st)
	}
	return out
}

// WriteReport writes what check-config shows of the settings: each effective setting on a
// line of its own, the values aligned, then every warning.
func (s *Settings) WriteReport(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, e := range s.Effective() {
		fmt.Fprintf(tw, "%s\t%s\n", e.Var, e.Value)
	}
	_ = tw.Flush()
	for _, warning := range s.Warnings() {
		fmt.Fprintf(w, "warning: %s\n", warning)
	}
}

// source names the variable a setting was read from: itself, except for the proxy settings,
// which fall back to their lower-case spelling.
func (s *Settings) source(name string) string {
	switch {
	case name == "HTTPS_PROXY" && s.proxyFrom != "":
		return s.proxyFrom
	case name == "NO_PROXY" && s.noProxyFrom != "":
		return s.noProxyFrom
	}
	return name
}

func (s *Settings) describeSecret(name, value string) (shown string, secret bool) {
	switch {
	case value == "":
		return "unset", true
	case name == "RTE_TOKEN":
		return "set (fingerprint " + protocol.TokenFingerprint(value) + ")", true
	case name == "HTTPS_PROXY":
		u, err := url.Parse(value)
		if err != nil {
			return "set", true
		}
		if u.User == nil {
			return value, false
		}
		u.User = nil
		return u.String() + " (credentials not shown)", true
	}
	return "set", true
}
