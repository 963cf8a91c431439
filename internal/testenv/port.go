package testenv

import (
	"fmt"
	"net"
)

// FreePort asks the kernel for a loopback port that is free now. Something else could take it
// before the caller listens; on loopback in a test that is rare, and the start fails loudly.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// MustFreePort is FreePort that fails t instead of returning an error.
func MustFreePort(t T) int {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return port
}
