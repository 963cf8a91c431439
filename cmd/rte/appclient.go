package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http/httpproxy"

	"github.com/rte-project/rte/config"
)

// appHTTPClient is the client for calls to the app: the proxy of HTTPS_PROXY/NO_PROXY, the
// system roots plus NODE_EXTRA_CA_CERTS, and no verification only when APP_TLS_VERIFY=0 said so.
func appHTTPClient(s *config.Settings, logger *zap.Logger) (*http.Client, error) {
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.ExtraCACerts != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		pem, err := os.ReadFile(s.ExtraCACerts)
		if err != nil {
			return nil, fmt.Errorf("read NODE_EXTRA_CA_CERTS: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("NODE_EXTRA_CA_CERTS %s holds no PEM certificate", s.ExtraCACerts)
		}
		tlsCfg.RootCAs = pool
	}
	if !s.AppTLSVerify {
		tlsCfg.InsecureSkipVerify = true // the operator said so with APP_TLS_VERIFY=0; warned at start
	}
	proxy := httpproxy.Config{HTTPSProxy: string(s.HTTPSProxy), HTTPProxy: string(s.HTTPSProxy), NoProxy: s.NoProxy}
	proxyFunc := proxy.ProxyFunc()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsCfg
	tr.Proxy = func(r *http.Request) (*url.URL, error) { return proxyFunc(r.URL) }
	logger.Debug("app client", zap.Bool("tls_verify", s.AppTLSVerify), zap.Bool("proxy", s.HTTPSProxy != ""))
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, nil
}
