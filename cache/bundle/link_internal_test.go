package bundle

import "testing"

func TestLinkTarget(t *testing.T) {
	tests := []struct {
		link, target, want string
		refused            bool
	}{
		{"a", "b", "b", false},
		{"a", "./b//c/", "b/c", false},
		{"a", ".", ".", false},
		{"d/a", "..", "..", false},
		{"d/e/a", "../../x/y", "../../x/y", false},
		{"a", "..", "", true},
		{"d/a", "../..", "", true},
		{"a", "/etc", "", true},
		{"a", "", "", true},
		{"a", "b/../c", "", true},
		{"d/a", "x/../../..", "", true},
		{"a", "b\x00", "", true},
	}
	for _, tc := range tests {
		got, rule := linkTarget(tc.link, tc.target)
		if tc.refused != (rule != "") || got != tc.want {
			t.Errorf("linkTarget(%q, %q) = %q, %q; want %q, refused=%v", tc.link, tc.target, got, rule, tc.want, tc.refused)
		}
	}
}

func TestEntryName(t *testing.T) {
	tests := []struct {
		name, want string
		refused    bool
	}{
		{"a/b", "a/b", false},
		{"./a/b/", "a/b", false},
		{"./", "", false},
		{"/etc/passwd", "", true},
		{"../x", "", true},
		{"a/../../x", "", true},
		{"a//b", "", true},
		{"a/./b", "", true},
		{"", "", true},
	}
	for _, tc := range tests {
		got, rule := entryName(tc.name)
		if tc.refused != (rule != "") || got != tc.want {
			t.Errorf("entryName(%q) = %q, %q; want %q, refused=%v", tc.name, got, rule, tc.want, tc.refused)
		}
	}
}
