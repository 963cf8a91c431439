// Package pgtest starts a private PostgreSQL server for tests: Debian's postgresql binaries
// (initdb and postgres), a data directory and a unix socket directory of its own, and a free
// loopback port, with password authentication as a real deployment has. A test package starts
// one in TestMain and gives each test a database of its own (NewDatabase).
//
// PostgreSQL refuses to run as root, so when the tests run as root the server runs as the
// user "nobody", in a directory that user owns. It refuses to fake a server: when the binaries
// are missing Start returns an error wrapping ErrMissing, naming what is missing, and the
// tests skip saying so.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rte-project/rte/internal/testenv"
)

// ErrMissing is wrapped by Start when the PostgreSQL binaries are not installed.
var ErrMissing = errors.New("PostgreSQL server binaries not found")

// BinDirs are where Start looks for initdb and postgres: $RTE_PG_BIN alone when set, else
// Debian's postgresql-15 package.
func BinDirs() []string {
	if d := os.Getenv("RTE_PG_BIN"); d != "" {
		return []string{d}
	}
	return []string{"/usr/lib/postgresql/15/bin"}
}

// Server is one running PostgreSQL server.
type Server struct {
	// Port is the loopback TCP port it listens on.
	Port     int
	dir      string
	password string
	cmd      *exec.Cmd
	exited   chan struct{}
	dbs      atomic.Int64
}

const role = "rte"

// Start initialises a data directory in a new temporary directory and starts the server on
// it, returning once it accepts connections. Stop removes it all.
func Start() (*Server, error) {
	bin := ""
	for _, d := range BinDirs() {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			bin = d
			break
		}
	}
	if bin == "" {
		return nil, fmt.Errorf("%w in %s: install Debian's postgresql package (apt-get install postgresql), or set RTE_PG_BIN to the directory holding initdb and postgres", ErrMissing, strings.Join(BinDirs(), " or "))
	}
	dir, err := os.MkdirTemp("", "rte-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, exited: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()
	var b [16]byte
	_, _ = rand.Read(b[:])
	s.password = hex.EncodeToString(b[:])

	cred, err := serverUser()
	if err != nil {
		return nil, err
	}
	// The server's user must reach its directories: the temporary directory is made 0700 for
	// root, so it is opened to traversal, and what the server writes is the server user's.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	for _, sub := range []string{"data", "run"} {
		p := filepath.Join(dir, sub)
		if err := os.Mkdir(p, 0o700); err != nil {
			return nil, err
		}
		if cred != nil {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, err
			}
		}
	}
	pwfile := filepath.Join(dir, "run", "pw")
	if err := os.WriteFile(pwfile, []byte(s.password+"\n"), 0o600); err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(pwfile, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", role,
		"--pwfile", pwfile, "--auth=scram-sha-256", "-E", "UTF8", "--no-locale", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	_ = os.Remove(pwfile)

	if s.Port, err = testenv.FreePort(); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	// fsync stays on: the benchmark compares commits made durable, as SQLite's are.
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", filepath.Join(dir, "data"),
		"-k", filepath.Join(dir, "run"), "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port),
		"-c", "max_connections=200")
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()

	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, s.URL("postgres"))
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			break
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("postgres exited at start: %s", s.log())
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("postgres did not accept connections within 30s (%v): %s", err, s.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	ok = true
	return s, nil
}

// serverUser is the user the server runs as: nil (this process's) unless this process is root.
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL refuses to run as root, and there is no user nobody to run it as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (s *Server) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

// URL is the URL of database db on the server, with the role's password.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", role, s.password, s.Port, db)
}

// NewDatabase creates an empty database with a name of its own and returns its URL.
func (s *Server) NewDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("t%d", s.dbs.Add(1))
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return s.URL(name), nil
}

// Stop stops the server (a fast shutdown: sessions are ended) and removes its directory.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.exited
		}
	}
	_ = os.RemoveAll(s.dir)
}
