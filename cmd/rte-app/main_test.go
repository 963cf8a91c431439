package main

import (
	"testing"
	"time"

	"github.com/rte-project/rte/internal/refapp/api"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Tests need not wait for the production keepalive and reconnect pacing.
	api.StreamKeepalive = 50 * time.Millisecond
	goleak.VerifyTestMain(m)
}
