// Package logging builds the zap logger both binaries write with, so `rte` and `rte-app` lines
// have the same keys (`time` in RFC 3339 with nanoseconds, `level`, `msg`) and an operator's log
// pipeline parses one shape. It owns only the encoder choice; what is logged, and at which
// level, stays with the caller. It refuses a level zap does not know rather than guessing.
package logging

import (
	"io"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a logger writing to w at level ("debug", "info", "warn", "error") in format
// "console" (capitalised levels, for a terminal) or anything else for JSON lines. Writes to w are
// serialised, so w need not be safe for concurrent use; zap's own errors go to w as well, so a
// broken sink is seen where the logs are read.
func New(level, format string, w io.Writer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "time"
	enc.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	var encoder zapcore.Encoder
	if format == "console" {
		enc.EncodeLevel = zapcore.CapitalLevelEncoder
		encoder = zapcore.NewConsoleEncoder(enc)
	} else {
		encoder = zapcore.NewJSONEncoder(enc)
	}
	sink := zapcore.Lock(zapcore.AddSync(w))
	return zap.New(zapcore.NewCore(encoder, sink, lvl), zap.ErrorOutput(sink)), nil
}
