package jobs

import (
	"archive/tar"
	"bytes"
	"testing"
)

// passwdArchive is /etc/passwd as the engine's archive endpoint gives it: a tar of one file.
func passwdArchive(t *testing.T, passwd string) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: "passwd", Mode: 0o644, Size: int64(len(passwd))}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(passwd)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

func TestPasswdHome(t *testing.T) {
	passwd := `root:x:0:0:root:/root:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
rte:x:10001:10001::/home/rte:/usr/sbin/nologin
broken:x:10002
slash:x:10003:10003::/:/bin/sh
rel:x:10004:10004::home/x:/bin/sh
dots:x:10005:10005::/home/../etc:/bin/sh
tmp:x:10006:10006::/tmp:/bin/sh
`
	for uid, want := range map[int]string{65534: "/nonexistent", 10001: "/home/rte", 10002: "", 10003: "", 10004: "", 10005: "", 10006: "", 4242: ""} {
		got, err := passwdHome(passwdArchive(t, passwd), uid)
		if err != nil || got != want {
			t.Errorf("passwdHome(uid %d) = %q, %v; want %q", uid, got, err, want)
		}
	}
	if _, err := passwdHome(bytes.NewReader(nil), 0); err == nil {
		t.Error("passwdHome of an empty archive gave no error")
	}
}
