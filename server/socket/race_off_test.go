//go:build !race

package socket_test

// raceEnabled is true under -race, where copying 16 MiB frames costs seconds.
const raceEnabled = false
