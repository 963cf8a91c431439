package app

import "time"

// SetCheckAnswerMargin shortens the wait for a check's answer beyond its timeout, for the
// tests of a runner that never answers; it returns a func that restores the default.
func SetCheckAnswerMargin(d time.Duration) (restore func()) {
	old := checkAnswerMargin
	checkAnswerMargin = d
	return func() { checkAnswerMargin = old }
}
