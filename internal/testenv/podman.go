package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/moby/moby/client"
)

var (
	podmanOnce sync.Once
	podmanHost string // unix://... of the service this test binary started
	podmanErr  error
	podmanCmd  *exec.Cmd
	podmanDir  string
)

// PodmanHost starts Podman's Docker-compatible API service (`podman system service`) on a
// private socket, once per test binary, makes sure image is in Podman's store (copied from
// Docker's with `docker save | podman load`, after RequireImage has built it there), and
// returns the socket's address. It skips t when podman is not installed, and fails it when
// podman is there but its service or the image cannot be had: an installed engine that does
// not work is a finding, not a skip. StopPodman, from TestMain, ends the service.
func PodmanHost(t T, image, target string) string {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		t.Skipf("podman is not installed: %v", err)
	}
	// The image comes from Docker's store (scripts/image builds with docker); without an
	// engine there is nothing to copy it from, as in scripts/fresh-root's bare container.
	missing := exec.Command("podman", "image", "exists", image).Run() != nil
	if missing && exec.Command("docker", "version").Run() != nil {
		t.Skipf("podman has no %s and no Docker engine answers to build it in and copy it from", image)
	}
	podmanOnce.Do(func() { podmanHost, podmanErr = startPodman() })
	if podmanErr != nil {
		t.Fatalf("podman: %v", podmanErr)
	}
	if missing {
		RequireImage(t, image, target)
		imagesMu.Lock()
		err := copyToPodman(image)
		imagesMu.Unlock()
		if err != nil {
			t.Fatalf("copy %s into podman's store: %v", image, err)
		}
	}
	return podmanHost
}

func startPodman() (string, error) {
	dir, err := os.MkdirTemp("", "rte-podman-")
	if err != nil {
		return "", err
	}
	podmanDir = dir
	host := "unix://" + filepath.Join(dir, "podman.sock")
	log, err := os.Create(filepath.Join(dir, "service.log"))
	if err != nil {
		return "", err
	}
	defer log.Close()
	// --time=0: no idle exit while tests wait between jobs; StopPodman or the test binary's
	// death (Pdeathsig) ends it.
	podmanCmd = exec.Command("podman", "system", "service", "--time=0", host)
	podmanCmd.Stdout, podmanCmd.Stderr = log, log
	podmanCmd.SysProcAttr = OwnGroupTiedToParent()
	if err := podmanCmd.Start(); err != nil {
		return "", fmt.Errorf("start podman system service: %v", err)
	}
	cli, err := client.New(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		return "", err
	}
	defer cli.Close()
	ok := Poll(30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
		return err == nil
	})
	if !ok {
		out, _ := os.ReadFile(filepath.Join(dir, "service.log"))
		return "", fmt.Errorf("the service at %s did not answer within 30s: %s", host, out)
	}
	return host, nil
}

func copyToPodman(image string) error {
	if exec.Command("podman", "image", "exists", image).Run() == nil {
		return nil
	}
	save := exec.Command("docker", "save", image)
	load := exec.Command("podman", "load")
	pipe, err := save.StdoutPipe()
	if err != nil {
		return err
	}
	load.Stdin = pipe
	if err := save.Start(); err != nil {
		return err
	}
	out, lerr := load.CombinedOutput()
	serr := save.Wait()
	if lerr != nil || serr != nil {
		return fmt.Errorf("docker save | podman load: %v %v: %s", serr, lerr, out)
	}
	return nil
}

// StopPodman ends the service PodmanHost started, if any, and removes its socket directory.
func StopPodman() {
	if podmanCmd != nil && podmanCmd.Process != nil {
		_ = podmanCmd.Process.Kill()
		_ = podmanCmd.Wait()
	}
	if podmanDir != "" {
		os.RemoveAll(podmanDir)
	}
}
