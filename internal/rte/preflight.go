package rte

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

// preflight finds what would stop serve at start that only files can tell: the CA bundle,
// the certificate and key, the local playbook folders, and the folders the RTE writes. serve
// runs it before it opens anything and check-config prints it, so the two cannot disagree.
// It writes nothing but a probe file, removed at once, in each folder the RTE writes to.
func preflight(s *config.Settings) []config.Problem {
	var list []config.Problem
	add := func(name string, err error) {
		if err != nil {
			list = append(list, config.Problem{Var: name, Message: err.Error()})
		}
	}

	// The CA bundle is read whenever the RTE calls the app: outbound, or inbound with APP_URL.
	if s.AppURL != "" && s.ExtraCACerts != "" && s.AppTLSVerify {
		_, err := appTLSConfig(s)
		add("NODE_EXTRA_CA_CERTS", err)
	}

	if s.HTTPS {
		create, err := pinning.Check(s.HTTPSCert, s.HTTPSKey)
		add("HTTPS_CERT", err)
		if create {
			add("HTTPS_CERT", writableDir(filepath.Dir(s.HTTPSCert), "the folder of HTTPS_CERT, where the RTE writes a new self-signed certificate"))
			if filepath.Dir(s.HTTPSKey) != filepath.Dir(s.HTTPSCert) {
				add("HTTPS_KEY", writableDir(filepath.Dir(s.HTTPSKey), "the folder of HTTPS_KEY, where the RTE writes a new key"))
			}
		}
	}

	if s.Files == protocol.FilesLocal {
		add("ANSIBLE_PATH", readableDir(s.AnsiblePath, "the playbooks' folder"))
		add("REPO_PATH", readableDir(s.RepoPath, "the inventories' folder"))
	}

	add("RTE_SPOOL_PATH", writableDir(s.SpoolPath, "the spool"))
	add("RTE_WORK_PATH", writableDir(s.WorkPath, "the job directories' folder"))
	if s.Files == protocol.FilesTransfer {
		add("RTE_CACHE_PATH", writableDir(s.CachePath, "the bundle cache"))
	}
	return list
}

// writableDir checks that dir can be written, or made: it exists as a folder that takes a new
// file, or its nearest existing parent does.
func writableDir(dir, what string) error {
	probe := dir
	for {
		info, err := os.Stat(probe)
		if err == nil {
			if !info.IsDir() {
				return fmt.Errorf("%s %s cannot be made: %s is not a folder", what, dir, probe)
			}
			break
		}
		// ENOTDIR: a file where a folder of the path should be; the walk up names it.
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return fmt.Errorf("%s %s: %w: make it reachable by the user running the RTE", what, dir, err)
		}
		parent := filepath.Dir(probe)
		if parent == probe {
			return fmt.Errorf("%s %s: no part of the path exists", what, dir)
		}
		probe = parent
	}
	f, err := os.CreateTemp(probe, ".rte-check-*")
	if err != nil {
		return fmt.Errorf("%s %s cannot be written (%v): give the user running the RTE write access to %s, or point the setting elsewhere", what, dir, err, probe)
	}
	name := f.Name()
	_ = f.Close()
	return os.Remove(name)
}

// readableDir checks that dir is a folder whose entries can be listed.
func readableDir(dir, what string) error {
	info, err := os.Stat(dir)
	switch {
	case err != nil:
		return fmt.Errorf("%s %s: %w: point the setting at the folder that holds them", what, dir, err)
	case !info.IsDir():
		return fmt.Errorf("%s %s is not a folder: point the setting at the folder that holds them", what, dir)
	}
	f, err := os.Open(dir)
	if err == nil {
		_, err = f.Readdirnames(1)
		_ = f.Close()
		if errors.Is(err, io.EOF) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("%s %s cannot be read: %w: give the user running the RTE read access", what, dir, err)
	}
	return nil
}
