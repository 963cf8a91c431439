package check_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Run answers only when every target has its outcome; goleak checks that no dial, handshake
// or test server goroutine outlives the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
