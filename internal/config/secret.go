package config

// Secret holds a token or a URL with credentials. It prints, marshals and logs as
// "[redacted]" so that a Settings passed whole to fmt, zap or encoding/json does not leak it;
// code that must send the value converts it with string(s), at the one place it is sent.
type Secret string

const redacted = "[redacted]"

// String implements fmt.Stringer, which fmt uses for %v, %s and %q.
func (Secret) String() string { return redacted }

// GoString implements fmt.GoStringer, which fmt uses for %#v.
func (Secret) GoString() string { return redacted }

// MarshalText implements encoding.TextMarshaler, which encoding/json and zap's reflection
// encoder use.
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }
