package rte

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

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/server/session"
)

// appHTTPClient is the client for calls to the app: the proxy of HTTPS_PROXY/NO_PROXY, the
// system roots plus NODE_EXTRA_CA_CERTS, and no verification only when APP_TLS_VERIFY=0 said so.
func appHTTPClient(s *config.Settings, logger *zap.Logger) (*http.Client, error) {
	tlsCfg, err := appTLSConfig(s)
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsCfg
	tr.Proxy = appProxy(s)
	logger.Debug("app client", zap.Bool("tls_verify", s.AppTLSVerify), zap.Bool("proxy", s.HTTPSProxy != ""))
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, nil
}

// appDialer is the outbound socket's dialer, with the same proxy and certificate checks as
// appHTTPClient.
func appDialer(s *config.Settings, logger *zap.Logger) (*session.Dialer, error) {
	tlsCfg, err := appTLSConfig(s)
	if err != nil {
		return nil, err
	}
	return &session.Dialer{
		AppURL:    s.AppURL,
		Token:     string(s.Token),
		Name:      s.Name,
		JoinToken: string(s.JoinToken),
		TLS:       tlsCfg,
		Proxy:     appProxy(s),
		Logger:    logger,
	}, nil
}

// appTLSConfig verifies the app's certificate against the system roots plus
// NODE_EXTRA_CA_CERTS, or not at all when APP_TLS_VERIFY=0.
func appTLSConfig(s *config.Settings) (*tls.Config, error) {
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.ExtraCACerts != "" && s.AppTLSVerify {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		pem, err := os.ReadFile(s.ExtraCACerts)
		if err != nil {
			return nil, fmt.Errorf("read NODE_EXTRA_CA_CERTS: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("NODE_EXTRA_CA_CERTS %s holds no PEM certificate: give a file with -----BEGIN CERTIFICATE----- blocks", s.ExtraCACerts)
		}
		tlsCfg.RootCAs = pool
	}
	if !s.AppTLSVerify {
		tlsCfg.InsecureSkipVerify = true // the operator said so with APP_TLS_VERIFY=0; warned at start
	}
	return tlsCfg, nil
}

// appProxy picks the proxy for a request to the app from HTTPS_PROXY and NO_PROXY. Like curl and
// Go, it never proxies localhost or a loopback address.
func appProxy(s *config.Settings) func(*http.Request) (*url.URL, error) {
	proxy := httpproxy.Config{HTTPSProxy: string(s.HTTPSProxy), HTTPProxy: string(s.HTTPSProxy), NoProxy: s.NoProxy}
	proxyFunc := proxy.ProxyFunc()
	return func(r *http.Request) (*url.URL, error) { return proxyFunc(r.URL) }
}
