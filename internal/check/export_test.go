package check

// SetWinRMHTTPPort moves the WinRM port that means plain HTTP (5985) to a test server's port,
// so tests need not bind 5985.
func SetWinRMHTTPPort(ch *Checker, port int) { ch.winrmHTTP = port }
