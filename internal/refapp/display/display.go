package display

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/rte-project/rte/protocol"
)

// OneLine makes text from a host safe for one terminal line: valid UTF-8, control
// characters (escape sequences, newlines) turned into spaces, runs of spaces folded, and at
// most n bytes.
func OneLine(s string, n int) string {
	// protocol.PeerText maps control characters to spaces and cuts on a character boundary;
	// what is the terminal's own is the replacement character and the folded spaces.
	s = protocol.PeerText(strings.ToValidUTF8(s, "\uFFFD"), math.MaxInt)
	return protocol.PeerText(strings.Join(strings.Fields(s), " "), n)
}

// Plural is n and word, with an s unless n is 1: "1 host", "3 hosts".
func Plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

// Duration shows seconds with two decimals under 10 s, one under a minute, then
// minutes and seconds; "-" for unknown.
func Duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < 10*time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	default:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
}
