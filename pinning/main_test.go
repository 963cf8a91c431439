package pinning_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The tests run real servers and clients; goleak checks that every connection goroutine they
// started has ended.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
