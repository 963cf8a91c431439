package rte

import (
	"runtime/debug"
	"testing"
)

func TestCommitSuffix(t *testing.T) {
	rev := "3f7bee0a1b2c3d4e5f60718293a4b5c6d7e8f901"
	cases := []struct {
		version  string
		settings []debug.BuildSetting
		want     string
	}{
		{"0.0.0-dev", nil, ""}, // no VCS stamp: nothing to add
		{"0.0.0-dev", []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "false"}}, "+3f7bee0a1b2c"},
		{"1.2.3", []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}, "+3f7bee0a1b2c.modified"},
		// Go's own pseudo-version names the commit already.
		{"0.0.0-20261202183751-3f7bee0a1b2c+dirty", []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}, ""},
		{"0.0.0-dev", []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}, "+abc"}, // a short revision (another VCS) whole
	}
	for _, c := range cases {
		if got := commitSuffix(c.version, c.settings); got != c.want {
			t.Errorf("commitSuffix(%q, %v) = %q, want %q", c.version, c.settings, got, c.want)
		}
	}
}
