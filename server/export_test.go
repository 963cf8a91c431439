package server

import "time"

// SetPause replaces how Serve waits out ShutdownPause, so a test can hold Serve inside it.
func (s *Server) SetPause(f func(time.Duration)) { s.pause = f }
