package chart_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The pod the test plays: the chart's first pod, as the kubelet would name and address it.
const podName = releaseName + "-0"

// TestPodRunsInDocker runs the RTE container of the rendered StatefulSet with the rte:dev image,
// translated to "docker run" the way the kubelet would run it: its env (downward API and Secret
// references resolved, $(VAR) expanded), its user and fsGroup, a read-only root filesystem, a
// volume or tmpfs for each of its mounts, its args, and its probes. The reference app runs in its
// own image on the same Docker network, where the pod's address resolves as cluster DNS would
// resolve it. The RTE registers, the test compares the certificate on the pod's volume with the
// one the app received and approves it by fingerprint, as NOTES.txt tells an operator to, and the
// example playbook runs. Then the container is replaced by a new one on the same volumes, as a
// rescheduled pod is: the app reconnects on the pin it holds, without approval, and a second job
// runs.
func TestPodRunsInDocker(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the Docker test builds images and runs containers")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "scripts", "image")
	if _, err := os.Stat(script); err != nil {
		t.Skipf("%s is not in this tree, so there is no way to build the rte:dev image here: the pod spec is not run in Docker", script)
	}
	if out, err := exec.Command("docker", "version", "--format", "{{.Server.Version}}").CombinedOutput(); err != nil {
		t.Skipf("no Docker engine answers (docker version: %v: %s): the pod spec is not run in Docker", err, bytes.TrimSpace(out))
	}
	// A cold build of the images (no layer cached) downloads every module and compiles the
	// binaries, which took over 15 minutes on a loaded 2-core machine; the rest takes about one.
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()

	// The images: scripts/image reuses its base and Docker's layer cache, so a second run is
	// quick. It tags them IMAGE_TAG, dev by default; the test runs what it tagged.
	tag := cmp.Or(os.Getenv("IMAGE_TAG"), "dev")
	build := exec.CommandContext(ctx, script, "rte", "rte-app") // the managed host is not needed
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("scripts/image: %v\n%s", err, out)
	}

	id := randomHex(t, 4)
	adminToken := randomHex(t, 16)
	rteToken := randomHex(t, 16)
	rel, err := install(t, values(t,
		"image.tag", tag,
		"appUrl", "http://app:8080",
		"token.value", rteToken,
		"maxJobs", 2,
		"drainSeconds", 5,
		"logLevel", "debug",
	))
	if err != nil {
		t.Fatalf("install: %v", err)
	}
	r := decode(t, rel)
	checkInvariants(t, r)
	pod := newPod(t, r, id)

	network := "rte-chart-" + id
	docker(t, ctx, "network", "create", network)
	t.Cleanup(func() { dockerQuiet("network", "rm", network) })

	app := "rte-chart-app-" + id
	docker(t, ctx, "run", "-d", "--name", app, "--network", network, "--network-alias", "app",
		"-e", "APP_ADMIN_TOKEN="+adminToken, "-e", "LOG_FORMAT=console", "-p", "127.0.0.1::8080", "rte-app:"+tag)
	t.Cleanup(func() { removeContainer(t, app) })
	api := &appAPI{base: "http://" + publishedAddr(t, ctx, app, "8080/tcp"), token: adminToken}

	// First start: a new volume, a new certificate, a registration waiting for approval.
	pod.start(t, ctx)
	probeUntilReady(t, ctx, pod)
	certSHA := pod.certificateSHA256(t, ctx)
	runner := api.waitRunner(t, ctx, podName, func(rn runnerView) bool { return rn.Pending != nil })
	if runner.Pending.SHA256 != certSHA {
		t.Fatalf("the app received certificate %s, but the pod's volume holds %s", runner.Pending.SHA256, certSHA)
	}
	if want := podName + "." + r.sts.Spec.ServiceName + "." + namespace + ".svc"; !slices.Contains(runner.Pending.DNSNames, want) {
		t.Fatalf("the certificate names %v, not the pod's address %s", runner.Pending.DNSNames, want)
	}
	if want := fmt.Sprintf("https://%s:%d", pod.alias, pod.ports["rte"]); runner.URL != want {
		t.Fatalf("the runner registered at %q, want the pod's own address %q", runner.URL, want)
	}
	api.post(t, ctx, "/api/v2/runners/"+podName+"/approve", map[string]string{"certificate_fingerprint": runner.Pending.Fingerprint}, nil)
	api.waitRunner(t, ctx, podName, func(rn runnerView) bool { return rn.Connected })
	api.runJob(t, ctx, podName)

	// A rescheduled pod: a new container on the same volumes keeps its certificate, so the app's
	// pin holds and it connects again with nobody approving anything.
	pod.stop(t, ctx)
	pod.start(t, ctx)
	probeUntilReady(t, ctx, pod)
	if again := pod.certificateSHA256(t, ctx); again != certSHA {
		t.Fatalf("after the restart the pod's certificate is %s, was %s: the pin would be lost", again, certSHA)
	}
	rn := api.waitRunner(t, ctx, podName, func(rn runnerView) bool { return rn.Connected })
	if rn.Certificate == nil || rn.Certificate.SHA256 != certSHA || rn.Pending != nil {
		t.Fatalf("after the restart the app pins %+v with %+v pending, want %s pinned and nothing pending", rn.Certificate, rn.Pending, certSHA)
	}
	api.runJob(t, ctx, podName)
}

// dockerPod is the RTE container of the rendered pod spec, as docker run arguments.
type dockerPod struct {
	name  string   // the container
	alias string   // <pod>.<service>.<namespace>.svc: what cluster DNS would resolve
	args  []string // docker run arguments, without the container's name
	cert  string   // HTTPS_CERT inside the container
	probe map[string]*corev1.Probe
	ports map[string]int32 // the container's named ports
	id    string           // this test's suffix of every Docker name

	// The kubelet makes an emptyDir anew for each pod; start does so for each container.
	emptyDirs []corev1.VolumeMount
	fsGroup   *int64
	image     string
	tail      []string // the image and its arguments, after the options
	starts    int
}

// newPod translates the StatefulSet's RTE container to docker run arguments, failing on any
// field the translation does not carry, so the test cannot silently run something other than
// what the chart renders.
func newPod(t *testing.T, r rendered, id string) *dockerPod {
	t.Helper()
	sts := r.sts
	spec := sts.Spec.Template.Spec
	c := container(t, sts)
	if len(spec.InitContainers) > 0 || len(spec.Containers) != 1 {
		t.Fatalf("the pod has %d init containers and %d containers; the translation runs one", len(spec.InitContainers), len(spec.Containers))
	}
	p := &dockerPod{
		name:  "rte-chart-" + podName + "-" + id,
		alias: podName + "." + sts.Spec.ServiceName + "." + namespace + ".svc",
		probe: map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe},
		ports: map[string]int32{},
		id:    id,
		image: c.Image,
	}
	args := []string{"--hostname", podName, "--network", "rte-chart-" + id, "--network-alias", p.alias}

	// Env in order, as the kubelet builds it: $(VAR) refers to a variable defined earlier.
	env := map[string]string{}
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom == nil:
			v = expand(v, env)
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = podName
			case "metadata.namespace":
				v = namespace
			default:
				t.Fatalf("env %s: the translation knows no downward API field %s", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom.SecretKeyRef != nil:
			v = secretValue(t, r, e.ValueFrom.SecretKeyRef)
		default:
			t.Fatalf("env %s: the translation knows no source %+v", e.Name, e.ValueFrom)
		}
		env[e.Name] = v
		args = append(args, "-e", e.Name+"="+v)
	}
	p.cert = env["HTTPS_CERT"]
	if len(c.EnvFrom) > 0 {
		t.Fatalf("envFrom is not translated: %v", c.EnvFrom)
	}

	// The user: the container's securityContext over the pod's; fsGroup as a supplementary group.
	psc, sc := spec.SecurityContext, c.SecurityContext
	if psc == nil || sc == nil {
		t.Fatalf("the pod spec has no securityContext (pod %v, container %v)", psc, sc)
	}
	uid, gid := pick(sc.RunAsUser, psc.RunAsUser), pick(sc.RunAsGroup, psc.RunAsGroup)
	if uid == nil || *uid == 0 {
		t.Fatalf("the pod spec gives no non-root runAsUser: %v", uid)
	}
	user := fmt.Sprint(*uid)
	if gid != nil {
		user += fmt.Sprint(":", *gid)
	}
	args = append(args, "--user", user)
	if psc.FSGroup != nil {
		args = append(args, "--group-add", fmt.Sprint(*psc.FSGroup))
	}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		args = append(args, "--read-only")
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		args = append(args, "--security-opt", "no-new-privileges")
	}
	if sc.Capabilities != nil {
		for _, d := range sc.Capabilities.Drop {
			args = append(args, "--cap-drop", string(d))
		}
		for _, a := range sc.Capabilities.Add {
			args = append(args, "--cap-add", string(a))
		}
	}

	// Volumes: a claim template is kept in named Docker volumes that outlive the container, as a
	// pod's claim outlives the pod, one per subPath (Docker 20.10 mounts no part of a volume):
	// each is a directory of the claim, as the kubelet makes it. An emptyDir is a named volume
	// made anew at each start (a tmpfs would take the mode of the image's directory beneath it,
	// which the kubelet's emptyDir does not). Docker's copy of the image's files into a new
	// volume is turned off: Kubernetes does not do it, so the test must not depend on it.
	p.fsGroup = psc.FSGroup
	kinds := map[string]string{}
	for _, v := range spec.Volumes {
		switch {
		case v.EmptyDir != nil:
			kinds[v.Name] = "emptyDir"
		default:
			t.Fatalf("volume %s: the translation knows emptyDir volumes and claim templates only: %+v", v.Name, v.VolumeSource)
		}
	}
	for _, vct := range sts.Spec.VolumeClaimTemplates {
		kinds[vct.Name] = "claim"
	}
	for _, m := range c.VolumeMounts {
		switch kinds[m.Name] {
		case "emptyDir":
			if m.SubPath != "" || m.ReadOnly {
				t.Fatalf("mount %s: a subPath or read-only mount of an emptyDir is not translated", m.Name)
			}
			p.emptyDirs = append(p.emptyDirs, m)
			continue
		case "claim":
			vol := strings.Join([]string{"rte-chart", m.Name, podName, strings.ReplaceAll(m.SubPath, "/", "-"), id}, "-")
			args = append(args, "--mount", "type=volume,source="+vol+",destination="+m.MountPath+",volume-nocopy=true")
			prepareVolume(t, vol, psc.FSGroup, 0o2775, c.Image)
		default:
			t.Fatalf("mount %s at %s: no volume of that name", m.Name, m.MountPath)
		}
		if m.ReadOnly {
			args[len(args)-1] += ",readonly"
		}
	}
	for _, port := range c.Ports {
		p.ports[port.Name] = port.ContainerPort
		args = append(args, "-p", fmt.Sprintf("127.0.0.1::%d/%s", port.ContainerPort, strings.ToLower(string(port.Protocol))))
	}
	if c.WorkingDir != "" {
		args = append(args, "--workdir", c.WorkingDir)
	}
	if len(c.Command) > 0 {
		args = append(args, "--entrypoint", c.Command[0])
	}
	// Docker's --stop-timeout is Kubernetes' grace period: SIGTERM, then SIGKILL after it.
	if g := spec.TerminationGracePeriodSeconds; g != nil {
		args = append(args, "--stop-timeout", fmt.Sprint(*g))
	}
	p.args = args
	p.tail = append(append([]string{c.Image}, c.Command[min(1, len(c.Command)):]...), c.Args...)
	return p
}

// prepareVolume makes a named volume as the kubelet hands a volume to a pod with an fsGroup:
// owned by that group, group-writable, new files inheriting the group (mode 2775 for a claim's
// directory, 2777 for an emptyDir).
func prepareVolume(t *testing.T, vol string, fsGroup *int64, mode os.FileMode, image string) {
	t.Helper()
	docker(t, context.Background(), "volume", "create", vol)
	t.Cleanup(func() { dockerQuiet("volume", "rm", "-f", vol) })
	script := fmt.Sprintf("chmod %o /volume", mode)
	if fsGroup != nil {
		script = fmt.Sprintf("chgrp %d /volume && %s", *fsGroup, script)
	}
	docker(t, context.Background(), "run", "--rm", "--user", "0", "--entrypoint", "sh", "-v", vol+":/volume", image, "-c", script)
}

func (p *dockerPod) start(t *testing.T, ctx context.Context) {
	t.Helper()
	p.starts++
	args := append([]string{"run", "-d", "--name", p.name}, p.args...)
	for _, m := range p.emptyDirs {
		vol := fmt.Sprintf("rte-chart-%s-%s-%d-%s", m.Name, podName, p.starts, p.id)
		prepareVolume(t, vol, p.fsGroup, 0o2777, p.image)
		args = append(args, "--mount", "type=volume,source="+vol+",destination="+m.MountPath+",volume-nocopy=true")
	}
	docker(t, ctx, append(args, p.tail...)...)
	t.Cleanup(func() { removeContainer(t, p.name) })
}

// stop is the kubelet's deletion of the pod: SIGTERM, the grace period, the container gone.
func (p *dockerPod) stop(t *testing.T, ctx context.Context) {
	t.Helper()
	docker(t, ctx, "stop", p.name)
	docker(t, ctx, "rm", p.name)
}

// certificateSHA256 reads the certificate off the pod's volume, as an operator seeding the app
// would (docs/install-helm.md), and returns its SHA-256 in the app's hex form.
func (p *dockerPod) certificateSHA256(t *testing.T, ctx context.Context) string {
	t.Helper()
	cert := p.certificate(t, ctx)
	sum := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(sum[:])
}

func (p *dockerPod) certificate(t *testing.T, ctx context.Context) *x509.Certificate {
	t.Helper()
	out, err := exec.CommandContext(ctx, "docker", "exec", p.name, "cat", p.cert).Output()
	if err != nil {
		t.Fatalf("read %s in the pod: %v", p.cert, err)
	}
	block, _ := pem.Decode(out)
	if block == nil {
		t.Fatalf("%s holds no PEM block", p.cert)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", p.cert, err)
	}
	return cert
}

// probeUntilReady runs the pod's probes as the kubelet would, until readiness passes. The
// kubelet does not verify a probe's certificate; the test does, against the pod's own
// certificate (it is made for localhost too).
func probeUntilReady(t *testing.T, ctx context.Context, p *dockerPod) {
	t.Helper()
	var last string
	for ctx.Err() == nil {
		if state, _ := exec.Command("docker", "inspect", "--format", "{{.State.Status}}", p.name).Output(); strings.TrimSpace(string(state)) != "running" {
			logs, _ := exec.Command("docker", "logs", p.name).CombinedOutput()
			t.Fatalf("the RTE container is %s:\n%s", bytes.TrimSpace(state), tail(logs, 40))
		}
		live, errLive := p.get(t, ctx, p.probe["liveness"])
		ready, errReady := p.get(t, ctx, p.probe["readiness"])
		if errLive == nil && errReady == nil && live == http.StatusOK && ready == http.StatusOK {
			return
		}
		last = fmt.Sprintf("liveness %d %v, readiness %d %v", live, errLive, ready, errReady)
		time.Sleep(200 * time.Millisecond)
	}
	logs, _ := exec.Command("docker", "logs", p.name).CombinedOutput()
	t.Fatalf("the pod never became ready (%s):\n%s", last, tail(logs, 40))
}

func (p *dockerPod) get(t *testing.T, ctx context.Context, probe *corev1.Probe) (int, error) {
	t.Helper()
	g := probe.HTTPGet
	port := g.Port.IntValue()
	if n, ok := p.ports[g.Port.String()]; ok {
		port = int(n)
	}
	addr := publishedAddr(t, ctx, p.name, fmt.Sprintf("%d/tcp", port))
	client := &http.Client{Timeout: time.Duration(probe.TimeoutSeconds) * time.Second}
	if g.Scheme == corev1.URISchemeHTTPS {
		out, err := exec.CommandContext(ctx, "docker", "exec", p.name, "cat", p.cert).Output()
		if err != nil {
			return 0, fmt.Errorf("no certificate yet: %w", err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(out)
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.ToLower(string(g.Scheme))+"://"+addr+g.Path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// appAPI is the reference app's admin API (docs/reference-app.md#the-admin-api).
type appAPI struct {
	base, token string
}

type certView struct {
	Fingerprint string   `json:"fingerprint"`
	SHA256      string   `json:"sha256"`
	DNSNames    []string `json:"dns_names"`
}

type runnerView struct {
	Name        string    `json:"name"`
	URL         string    `json:"url"`
	State       string    `json:"state"`
	Connected   bool      `json:"connected"`
	Certificate *certView `json:"certificate"`
	Pending     *certView `json:"pending_certificate"`
}

func (a *appAPI) do(ctx context.Context, method, path string, body, into any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	if into != nil {
		return resp.StatusCode, json.Unmarshal(b, into)
	}
	return resp.StatusCode, nil
}

func (a *appAPI) post(t *testing.T, ctx context.Context, path string, body, into any) {
	t.Helper()
	if _, err := a.do(ctx, http.MethodPost, path, body, into); err != nil {
		t.Fatal(err)
	}
}

// waitRunner polls the runner list until the named runner satisfies ok.
func (a *appAPI) waitRunner(t *testing.T, ctx context.Context, name string, ok func(runnerView) bool) runnerView {
	t.Helper()
	var last any = "no answer"
	for ctx.Err() == nil {
		var list struct {
			Runners []runnerView `json:"runners"`
		}
		if _, err := a.do(ctx, http.MethodGet, "/api/v2/runners", nil, &list); err != nil {
			last = err
		} else {
			last = list.Runners
			for _, rn := range list.Runners {
				if rn.Name == name && ok(rn) {
					return rn
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("runner %s never reached the state wanted; last seen %+v", name, last)
	return runnerView{}
}

// runJob runs the example playbook on the runner and checks it ended well, with its recap
// stored by the app.
func (a *appAPI) runJob(t *testing.T, ctx context.Context, runner string) {
	t.Helper()
	var job struct {
		ID       string `json:"id"`
		State    string `json:"state"`
		Status   string `json:"status"`
		ExitCode int    `json:"exit_code"`
		Message  string `json:"message"`
	}
	a.post(t, ctx, "/api/v2/jobs", map[string]any{"runner": runner, "playbook": "site.yml", "inventories": []string{"hosts.yml"}}, &job)
	for job.State != "ended" && ctx.Err() == nil {
		time.Sleep(250 * time.Millisecond)
		if _, err := a.do(ctx, http.MethodGet, "/api/v2/jobs/"+job.ID, nil, &job); err != nil {
			t.Fatal(err)
		}
	}
	if job.Status != "success" || job.ExitCode != 0 {
		t.Fatalf("job %s ended %s (exit %d): %s", job.ID, job.Status, job.ExitCode, job.Message)
	}
	var recs struct {
		Records []struct {
			Seq  int64           `json:"seq"`
			Kind string          `json:"kind"`
			Data json.RawMessage `json:"data"`
		} `json:"records"`
	}
	if _, err := a.do(ctx, http.MethodGet, "/api/v2/jobs/"+job.ID+"/records?limit=5000", nil, &recs); err != nil {
		t.Fatal(err)
	}
	var output strings.Builder
	kinds := map[string]int{}
	for i, rec := range recs.Records {
		if rec.Seq != int64(i+1) {
			t.Fatalf("record %d has seq %d: the stored records skip or repeat", i+1, rec.Seq)
		}
		kinds[rec.Kind]++
		if rec.Kind == "output" {
			var d struct {
				Text string `json:"text"`
			}
			if err := json.Unmarshal(rec.Data, &d); err != nil {
				t.Fatalf("output record %d: %v", rec.Seq, err)
			}
			output.WriteString(d.Text)
		}
	}
	if kinds["start"] != 1 || kinds["end"] != 1 || !strings.Contains(output.String(), "PLAY RECAP") {
		t.Fatalf("job %s: records by kind %v and output without a recap:\n%s", job.ID, kinds, output.String())
	}
}

// expand resolves $(VAR) as Kubernetes does for env values: a defined earlier variable is
// replaced, an unknown one stays as written, and $$ is a literal $.
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch {
		case s[i+1] == '$':
			b.WriteByte('$')
			i++
		case s[i+1] == '(':
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+end+1])
			}
			i += end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

func secretValue(t *testing.T, r rendered, ref *corev1.SecretKeySelector) string {
	t.Helper()
	for _, s := range r.secrets {
		if s.Name == ref.Name {
			if v, ok := s.Data[ref.Key]; ok {
				return string(v)
			}
		}
	}
	t.Fatalf("Secret %s key %s is not among the rendered Secrets", ref.Name, ref.Key)
	return ""
}

func pick(a, b *int64) *int64 {
	if a != nil {
		return a
	}
	return b
}

func docker(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("docker %s: %v: %s", strings.Join(redact(args), " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return strings.TrimSpace(string(out))
}

// redact keeps tokens out of failure messages.
func redact(args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if k, _, ok := strings.Cut(a, "="); ok && strings.Contains(k, "TOKEN") {
			out[i] = k + "=<redacted>"
		}
	}
	return out
}

func dockerQuiet(args ...string) {
	_ = exec.Command("docker", args...).Run()
}

// removeContainer shows the container's log when the test failed, then removes it.
func removeContainer(t *testing.T, name string) {
	if t.Failed() {
		if logs, err := exec.Command("docker", "logs", name).CombinedOutput(); err == nil {
			t.Logf("log of %s:\n%s", name, tail(logs, 60))
		}
	}
	dockerQuiet("rm", "-f", "-v", name)
}

func publishedAddr(t *testing.T, ctx context.Context, container, port string) string {
	t.Helper()
	out := docker(t, ctx, "port", container, port)
	addr, _, _ := strings.Cut(out, "\n") // one line per address family
	return addr
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
