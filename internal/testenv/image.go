package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/client"
)

var (
	imagesMu sync.Mutex
	imageErr = map[string]error{} // by target, once built or failed
)

// RequireImage makes sure image (such as rte:dev) is in the local Docker engine: when it is
// missing, scripts/image builds target (such as rte) once per test binary, and a failed build
// fails t. A test that needs an image never skips for want of it where an engine answers: on a
// fresh machine the engine starts empty, and a skip there would hide every container test. An
// image that is present is used as it is, whatever commit built it; the tests that must run
// this tree's binaries in an image (deploy, charts) build it themselves.
func RequireImage(t T, image, target string) {
	t.Helper()
	if exec.Command("docker", "image", "inspect", image).Run() == nil {
		return
	}
	imagesMu.Lock()
	defer imagesMu.Unlock()
	err, done := imageErr[target]
	if !done {
		err = buildImage(target)
		imageErr[target] = err
	}
	if err != nil {
		t.Fatalf("image %s is missing and could not be built: %v", image, err)
	}
}

func buildImage(target string) error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(root, "scripts", "image"), target)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("scripts/image %s: %v\n%s", target, err, bytes.TrimSpace(out))
	}
	return nil
}

// ModuleRoot is the directory holding go.mod, found from the working directory up: go test
// runs a package's tests in the package's directory, and rte-bench runs from the repository.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir || strings.TrimSpace(parent) == "" {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// EngineClient is a client of the container engine (Docker, or Podman's Docker-compatible
// service) at host, closed when the test ends; it skips t, saying so, when no engine answers
// there: a machine without an engine cannot run container tests, and says which it skipped.
func EngineClient(t T, name, host string) *client.Client {
	t.Helper()
	cli, err := client.New(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Skipf("no %s client for %s: %v", name, host, err)
	}
	t.Cleanup(func() { cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		t.Skipf("no %s engine answers at %s: %v", name, host, err)
	}
	return cli
}
