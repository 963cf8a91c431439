package jobs

import (
	"archive/tar"
	"bufio"
	"context"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// The job's user needs a writable home in its container. ansible-playbook makes its temporary
// directories under ~/.ansible (remote_tmp, local_tmp, the ssh control path, async results),
// and for connection: local it expands that ~ with the user's passwd entry, not HOME. The root
// file system is read-only, so the home named in the image's /etc/passwd gets a small tmpfs.
// Which home that is depends on the image and on the uid (nobody's is /nonexistent in Debian
// images, the rte image's user 10001 has /home/rte, an execution environment may have
// /runner), so the RTE reads it from the image itself, once per image, through a container that
// is created but never started.

// maxPasswdBytes bounds what is read of an image's /etc/passwd.
const maxPasswdBytes = 1 << 20

// homeIn is the passwd home of the job's user in image, "" when the image has no entry for
// that uid or no /etc/passwd (the job then runs without a writable home, as the image wants).
// Results are kept by image id, so a tag that moves to another image is read again.
func (d *dockerEngine) homeIn(ctx context.Context, image string) (string, error) {
	ins, err := d.cli.ImageInspect(ctx, image)
	if err != nil {
		return "", fmt.Errorf("inspect image %s: %v", image, err)
	}
	d.homesMu.Lock()
	home, ok := d.homes[ins.ID]
	d.homesMu.Unlock()
	if ok {
		return home, nil
	}
	created, err := d.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:      image,
			User:       strconv.Itoa(d.uid) + ":" + strconv.Itoa(d.gid),
			Entrypoint: []string{"/bin/true"},
			// Labelled as the RTE's, so a restart removes it if this RTE dies before it does.
			Labels: map[string]string{LabelName: d.cfg.Name, LabelJob: ""},
		},
		HostConfig: &container.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		return "", fmt.Errorf("read the job user's home in image %s: create a container: %v", image, err)
	}
	defer func() {
		_, _ = d.cli.ContainerRemove(context.WithoutCancel(ctx), created.ID, client.ContainerRemoveOptions{Force: true})
	}()
	res, err := d.cli.CopyFromContainer(ctx, created.ID, client.CopyFromContainerOptions{SourcePath: "/etc/passwd"})
	if err != nil {
		// No /etc/passwd (a distroless image): nothing names a home, so none is mounted.
		d.remember(ins.ID, "")
		return "", nil
	}
	defer res.Content.Close()
	home, err = passwdHome(res.Content, d.uid)
	if err != nil {
		return "", fmt.Errorf("read /etc/passwd of image %s: %v", image, err)
	}
	d.remember(ins.ID, home)
	return home, nil
}

func (d *dockerEngine) remember(imageID, home string) {
	d.homesMu.Lock()
	d.homes[imageID] = home
	d.homesMu.Unlock()
}

// passwdHome reads the tar stream the engine gives for /etc/passwd and returns the home of
// uid: an absolute, clean path other than / and /tmp (which is a tmpfs already), else "".
func passwdHome(archive io.Reader, uid int) (string, error) {
	tr := tar.NewReader(archive)
	if _, err := tr.Next(); err != nil {
		return "", err
	}
	sc := bufio.NewScanner(io.LimitReader(tr, maxPasswdBytes))
	sc.Buffer(make([]byte, 4096), 64<<10)
	want := strconv.Itoa(uid)
	for sc.Scan() {
		// name:password:uid:gid:gecos:home:shell
		f := strings.Split(sc.Text(), ":")
		if len(f) < 7 || f[2] != want {
			continue
		}
		home := f[5]
		if !path.IsAbs(home) || path.Clean(home) != home || home == "/" || home == "/tmp" {
			return "", nil
		}
		return home, nil
	}
	return "", sc.Err()
}
