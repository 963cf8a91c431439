package rte

import (
	"runtime/debug"
	"strings"
)

// BuildVersion is what `rte version`, hello, registration and rte_build_info say: stamped (the
// -ldflags "-X main.version=..." value) or else the module version Go recorded (a pseudo-version
// naming the commit, "+dirty" for changes, when built in a git checkout; the release when go
// install fetched one), else 0.0.0-dev. Unless it names the commit already, the commit Go
// recorded at build time (vcs.revision, first 12 hex digits) follows as semver build metadata,
// with ".modified" when the tree had uncommitted changes (vcs.modified), so every build from a
// checkout says which source it is.
func BuildVersion(stamped string) string {
	v := stamped
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = &debug.BuildInfo{}
	}
	if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = strings.TrimPrefix(bi.Main.Version, "v")
	}
	if v == "" {
		v = "0.0.0-dev"
	}
	return v + commitSuffix(v, bi.Settings)
}

func commitSuffix(v string, settings []debug.BuildSetting) string {
	var rev string
	modified := false
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" || strings.Contains(v, rev[:min(12, len(rev))]) {
		return ""
	}
	suffix := "+" + rev[:min(12, len(rev))]
	if modified {
		suffix += ".modified"
	}
	return suffix
}
