//go:build !linux

package demo

import "syscall"

// childAttr: the demo needs Linux (Debian's ansible-core and openssh); elsewhere the
// children keep the default attributes.
func childAttr() *syscall.SysProcAttr { return nil }
