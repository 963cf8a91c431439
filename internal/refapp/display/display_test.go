package display

import "testing"

func TestOneLine(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"plain", 10, "plain"},
		{"a\nb\x1b[31m  c\t", 20, "a b [31m c"},
		{"bad \xff byte", 20, "bad \uFFFD byte"},
		{"héllo wörld", 2, "h..."},
		{"héllo wörld", 3, "hé..."},
		{"  lots   of   space  ", 100, "lots of space"},
	} {
		if got := OneLine(c.in, c.n); got != c.want {
			t.Errorf("OneLine(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

func TestPluralAndDuration(t *testing.T) {
	if got := Plural(1, "host"); got != "1 host" {
		t.Errorf("Plural(1) = %q", got)
	}
	if got := Plural(3, "host"); got != "3 hosts" {
		t.Errorf("Plural(3) = %q", got)
	}
	if got := Duration(-1); got != "-" {
		t.Errorf("Duration(-1) = %q, want -", got)
	}
}
