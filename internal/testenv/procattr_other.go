//go:build !linux

package testenv

import "syscall"

// OwnGroupTiedToParent: the demo needs Linux (Debian's ansible-core and openssh), and only
// Linux has Pdeathsig; elsewhere the children keep the default attributes.
func OwnGroupTiedToParent() *syscall.SysProcAttr { return nil }
