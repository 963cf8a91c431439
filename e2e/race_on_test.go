//go:build race

package e2e

// raceEnabled builds the binaries under test with -race when the tests themselves run with it.
const raceEnabled = true
