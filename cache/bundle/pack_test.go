package bundle_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rte-project/rte/cache/bundle"
)

func sampleTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	writeTree(t, root,
		node{Path: "site.yml", Data: "- hosts: all\n  roles: [web]\n"},
		node{Path: "run.sh", Data: "#!/bin/sh\necho hi\n", Mode: 0o755},
		node{Path: "private.yml", Data: "secret: 1\n", Mode: 0o600},
		node{Path: "roles/web/tasks/main.yml", Data: "- debug: msg=hi\n"},
		node{Path: "roles/web/files/server.pem", Data: "-----BEGIN CERTIFICATE-----\n"},
		node{Path: "roles/closed", Dir: true, Mode: 0o700},
		node{Path: "roles/current", Link: "web"},
		node{Path: "roles/web/tasks/up", Link: "../../../site.yml"},
		node{Path: "group_vars/all.yml", Data: "x: 1\n"},
	)
	return root
}

func TestPackIsDeterministic(t *testing.T) {
	root := sampleTree(t)
	first, name := packBytes(t, root, bundle.PackOptions{})
	sum := sha256.Sum256(first)
	if want := "sha256:" + hex.EncodeToString(sum[:]); name != want {
		t.Fatalf("name = %s, want the sha256 of the bytes written, %s", name, want)
	}

	again, name2 := packBytes(t, root, bundle.PackOptions{})
	if name2 != name || !bytes.Equal(again, first) {
		t.Fatalf("second pack of an unchanged tree gave %s, want %s", name2, name)
	}

	// Reading a file, touching it, or checking it out again changes times but not the bundle.
	p := filepath.Join(root, "site.yml")
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(p, later, later); err != nil {
		t.Fatal(err)
	}
	if _, n := packBytes(t, root, bundle.PackOptions{}); n != name {
		t.Fatalf("pack after touching site.yml gave %s, want the same name %s", n, name)
	}

	if err := os.WriteFile(p, []byte("- hosts: web\n  roles: [web]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, n := packBytes(t, root, bundle.PackOptions{}); n == name {
		t.Fatalf("pack after changing site.yml kept the name %s, want a new one", name)
	}
}

func TestPackRoundTripKeepsModesAndLinks(t *testing.T) {
	root := sampleTree(t)
	setuid := filepath.Join(root, "suid.sh")
	writeTree(t, root, node{Path: "suid.sh", Data: "#!/bin/sh\n", Mode: 0o755})
	if err := os.Chmod(setuid, 0o755|fs.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	data, _ := packBytes(t, root, bundle.PackOptions{})
	dest := t.TempDir()
	if err := bundle.Unpack(context.Background(), bytes.NewReader(data), dest, bundle.UnpackLimits{}); err != nil {
		t.Fatalf("Unpack of a packed tree: %v", err)
	}
	want := listTree(t, root)
	if !strings.HasPrefix(want["suid.sh"], "file 40000755 ") {
		t.Fatalf("source suid.sh is %q; the test expected setuid 0755", want["suid.sh"])
	}
	want["suid.sh"] = "file 755" + strings.TrimPrefix(want["suid.sh"], "file 40000755") // setuid dropped
	got := listTree(t, dest)
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: unpacked as %q, want %q", p, got[p], w)
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: unpacked (%s) but not in the source", p, g)
		}
	}
	b, err := os.ReadFile(filepath.Join(dest, "roles/current/tasks/up"))
	if err != nil || !strings.HasPrefix(string(b), "- hosts") {
		t.Errorf("reading through the unpacked symlinks gave %q, %v; want site.yml", b, err)
	}
}

func TestPackExcludesKeysAndVCS(t *testing.T) {
	root := sampleTree(t)
	writeTree(t, root,
		node{Path: ".ssh/config", Data: "Host *\n"},
		node{Path: "roles/web/.ssh/authorized_keys", Data: "ssh-ed25519 AAAA\n"},
		node{Path: "keys/id_rsa", Data: "-----BEGIN OPENSSH PRIVATE KEY-----\n"},
		node{Path: "keys/id_ed25519", Data: "-----BEGIN OPENSSH PRIVATE KEY-----\n"},
		node{Path: "keys/id_ed25519.pub", Data: "ssh-ed25519 AAAA\n"},
		node{Path: ".git/HEAD", Data: "ref: refs/heads/main\n"},
		node{Path: "extra/skip.me", Data: "x"},
	)
	opts := bundle.PackOptions{Exclude: func(rel string, d fs.DirEntry) bool { return rel == "extra" }}
	data, _ := packBytes(t, root, opts)
	dest := t.TempDir()
	if err := bundle.Unpack(context.Background(), bytes.NewReader(data), dest, bundle.UnpackLimits{}); err != nil {
		t.Fatal(err)
	}
	got := listTree(t, dest)
	for _, gone := range []string{".ssh", "roles/web/.ssh", "keys/id_rsa", "keys/id_ed25519", ".git", "extra"} {
		if _, ok := got[gone]; ok {
			t.Errorf("%s was packed; it must never be sent", gone)
		}
	}
	for _, kept := range []string{"keys/id_ed25519.pub", "roles/web/files/server.pem", "site.yml"} {
		if _, ok := got[kept]; !ok {
			t.Errorf("%s was left out; only private identities and .ssh, .git, .hg, .svn are", kept)
		}
	}
}

func TestPackRefuses(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, root string)
		entry string
		rule  string
	}{
		{"absolute symlink", func(t *testing.T, root string) {
			writeTree(t, root, node{Path: "etc", Link: "/etc"})
		}, "etc", "absolute"},
		{"symlink out of the tree", func(t *testing.T, root string) {
			writeTree(t, root, node{Path: "roles/shared", Link: "../../shared-roles"})
		}, "roles/shared", "leaves"},
		{"symlink with .. after a name", func(t *testing.T, root string) {
			writeTree(t, root, node{Path: "here", Link: "."}, node{Path: "l", Link: "here/../x"})
		}, "l", `".." after a name`},
		{"fifo", func(t *testing.T, root string) {
			if err := unix.Mkfifo(filepath.Join(root, "pipe"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "pipe", "fifo"},
		{"socket", func(t *testing.T, root string) {
			l, err := net.Listen("unix", filepath.Join(root, "ctl.sock"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}, "ctl.sock", "socket"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := sampleTree(t)
			tc.setup(t, root)
			var buf bytes.Buffer
			_, _, err := bundle.Pack(context.Background(), root, &buf, bundle.PackOptions{})
			var ue *bundle.UnsafeEntryError
			if !errors.As(err, &ue) || ue.Entry != tc.entry || !strings.Contains(ue.Rule, tc.rule) {
				t.Fatalf("Pack error = %v, want an UnsafeEntryError for %q saying %q", err, tc.entry, tc.rule)
			}
			if buf.Len() != 0 {
				t.Errorf("Pack wrote %d bytes before refusing; want none", buf.Len())
			}
		})
	}
}

func TestPackTooLarge(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, node{Path: "a", Data: strings.Repeat("x", 600)}, node{Path: "b/c", Data: strings.Repeat("y", 600)})
	var buf bytes.Buffer
	_, _, err := bundle.Pack(context.Background(), root, &buf, bundle.PackOptions{MaxBytes: 1000})
	var tl *bundle.TooLargeError
	if !errors.As(err, &tl) || tl.Size != 1200 || tl.Limit != 1000 {
		t.Fatalf("Pack error = %v, want a TooLargeError of 1200 bytes over 1000", err)
	}
	if !strings.Contains(err.Error(), "RTE_FILES=local") || buf.Len() != 0 {
		t.Errorf("error %q should tell to mount the directory (RTE_FILES=local) and nothing be written (wrote %d)", err, buf.Len())
	}
	if _, _, err := bundle.Pack(context.Background(), root, &buf, bundle.PackOptions{MaxBytes: 1200}); err != nil {
		t.Errorf("Pack at exactly the limit: %v, want success", err)
	}
}

func TestPackRootRules(t *testing.T) {
	root := sampleTree(t)
	link := filepath.Join(t.TempDir(), "current")
	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}
	_, viaLink := packBytes(t, link, bundle.PackOptions{})
	_, direct := packBytes(t, root, bundle.PackOptions{})
	if viaLink != direct {
		t.Errorf("packing through a symlinked root gave %s, want %s as for the directory itself", viaLink, direct)
	}
	ssh := filepath.Join(t.TempDir(), ".ssh")
	writeTree(t, ssh, node{Path: "id_rsa", Data: "key"})
	if _, _, err := bundle.Pack(context.Background(), ssh, &bytes.Buffer{}, bundle.PackOptions{}); err == nil {
		t.Error("Pack of a .ssh directory succeeded; want a refusal")
	}
	if _, _, err := bundle.Pack(context.Background(), filepath.Join(root, "site.yml"), &bytes.Buffer{}, bundle.PackOptions{}); err == nil {
		t.Error("Pack of a file succeeded; want 'not a directory'")
	}
}

func TestPackCanceled(t *testing.T) {
	root := sampleTree(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := bundle.Pack(ctx, root, &bytes.Buffer{}, bundle.PackOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Pack with a canceled context: %v, want context.Canceled", err)
	}
}
