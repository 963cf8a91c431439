package cache_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(pinnerEnv) != "" {
		pinnerMain() // this binary, re-run as a second RTE process that pins a bundle
		return
	}
	goleak.VerifyTestMain(m)
}
