package cli

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/refapptest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Tests need not wait for the production keepalive and reconnect pacing.
	api.StreamKeepalive = 50 * time.Millisecond
	goleak.VerifyTestMain(m)
}

// run is rte-app's dispatch for the commands of this package: what main does with args.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	return Run(ctx, args[0], args[1:], environ, stdout, stderr)
}

// runCLI runs rte-app with args against ta and returns the exit status and what it printed.
func runCLI(t *testing.T, ta *refapptest.App, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr refapptest.SyncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env := []string{"APP_ADMIN_TOKEN=" + refapptest.AdminToken, "APP_URL=" + ta.URL}
	code := run(ctx, args, env, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}
