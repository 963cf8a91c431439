// Package chart_test checks the Helm chart in this directory with Helm's own SDK: lint, the
// schema's refusals, a matrix of values rendered as "helm install --dry-run" renders them and
// decoded strictly into the Kubernetes API types, and (docker_test.go) the rendered RTE
// container run with the rte:dev image against the real app half.
//
// The test lives beside the chart, in a package of its own, so that the Helm SDK and the
// Kubernetes modules it brings are compiled into this one test binary only: no other package of
// the project, and none of the e2e tests, pays their build time.
package chart_test

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

const (
	releaseName = "rte"
	namespace   = "automation"
	// kubeVersion is what the dry run claims the cluster runs: the oldest the chart supports
	// (Chart.yaml's kubeVersion) would do; a recent one matches what operators run.
	kubeVersion = "v1.31.0"
	goodToken   = "0123456789abcdef0123456789abcdef"
)

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(".")
	if err != nil {
		t.Fatalf("load the chart: %v", err)
	}
	return c
}

// install renders the chart as "helm install --dry-run=client" does: the schema is checked,
// the templates run, and nothing talks to a cluster.
func install(t *testing.T, vals map[string]any) (*release.Release, error) {
	t.Helper()
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(action.NewConfiguration())
	in.ReleaseName = releaseName
	in.Namespace = namespace
	in.DryRunStrategy = action.DryRunClient
	in.Replace = true // no release store to look names up in
	in.KubeVersion = kv
	rel, err := in.Run(loadChart(t), vals)
	if err != nil {
		return nil, err
	}
	r, ok := rel.(*release.Release)
	if !ok {
		t.Fatalf("install returned a %T, not a *release.Release", rel)
	}
	return r, nil
}

// rendered is one release's objects, decoded into the API types.
type rendered struct {
	notes          string
	sts            *appsv1.StatefulSet
	services       []*corev1.Service
	secrets        []*corev1.Secret
	accounts       []*corev1.ServiceAccount
	claims         []*corev1.PersistentVolumeClaim
	pdbs           []*policyv1.PodDisruptionBudget
	policies       []*networkingv1.NetworkPolicy
	serviceMonitor *serviceMonitor
}

// serviceMonitor is the part of the Prometheus operator's monitoring.coreos.com/v1
// ServiceMonitor the chart writes, with the operator's field names: decoding it strictly
// refuses a misspelt field, as the operator's CRD schema would.
type serviceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Scheme        string `json:"scheme"`
			Interval      string `json:"interval"`
			Authorization struct {
				Type        string                   `json:"type"`
				Credentials corev1.SecretKeySelector `json:"credentials"`
			} `json:"authorization"`
			TLSConfig *struct {
				InsecureSkipVerify bool   `json:"insecureSkipVerify"`
				ServerName         string `json:"serverName,omitempty"`
			} `json:"tlsConfig,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// strict decodes into the registered API types and fails on a field they do not have (a
// misspelt key or one at the wrong indentation would otherwise vanish at apply time).
var strict = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

func decode(t *testing.T, rel *release.Release) rendered {
	t.Helper()
	out := rendered{notes: rel.Info.Notes}
	docs := releaseutil.SplitManifests(rel.Manifest)
	for _, name := range slices.Sorted(maps.Keys(docs)) {
		doc := docs[name]
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s: not YAML: %v\n%s", name, err, doc)
		}
		if head.APIVersion == "monitoring.coreos.com/v1" && head.Kind == "ServiceMonitor" {
			var sm serviceMonitor
			if err := yaml.UnmarshalStrict([]byte(doc), &sm); err != nil {
				t.Fatalf("ServiceMonitor: %v\n%s", err, doc)
			}
			out.serviceMonitor = &sm
			continue
		}
		obj, _, err := strict.Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s %s: strict decoding: %v\n%s", head.APIVersion, head.Kind, err, doc)
		}
		switch o := obj.(type) {
		case *appsv1.StatefulSet:
			if out.sts != nil {
				t.Fatalf("two StatefulSets rendered")
			}
			out.sts = o
		case *corev1.Service:
			out.services = append(out.services, o)
		case *corev1.Secret:
			out.secrets = append(out.secrets, o)
		case *corev1.ServiceAccount:
			out.accounts = append(out.accounts, o)
		case *corev1.PersistentVolumeClaim:
			out.claims = append(out.claims, o)
		case *policyv1.PodDisruptionBudget:
			out.pdbs = append(out.pdbs, o)
		case *networkingv1.NetworkPolicy:
			out.policies = append(out.policies, o)
		default:
			t.Fatalf("%s: the chart rendered a %T the test does not check", name, obj)
		}
		checkMeta(t, obj)
	}
	if out.sts == nil {
		t.Fatalf("no StatefulSet rendered; manifest:\n%s", rel.Manifest)
	}
	return out
}

// checkMeta holds for every object: in the release's namespace, with the standard labels.
func checkMeta(t *testing.T, obj runtime.Object) {
	t.Helper()
	m, ok := obj.(interface {
		GetNamespace() string
		GetLabels() map[string]string
		GetName() string
	})
	if !ok {
		t.Fatalf("%T has no object metadata", obj)
	}
	if m.GetNamespace() != namespace {
		t.Errorf("%T %s: namespace %q, want %q", obj, m.GetName(), m.GetNamespace(), namespace)
	}
	for _, l := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart"} {
		if m.GetLabels()[l] == "" {
			t.Errorf("%T %s: label %s missing; labels %v", obj, m.GetName(), l, m.GetLabels())
		}
	}
}

func container(t *testing.T, sts *appsv1.StatefulSet) *corev1.Container {
	t.Helper()
	for i := range sts.Spec.Template.Spec.Containers {
		if c := &sts.Spec.Template.Spec.Containers[i]; c.Name == "rte" {
			return c
		}
	}
	t.Fatalf("no container named rte in %v", sts.Spec.Template.Spec.Containers)
	return nil
}

func envVar(c *corev1.Container, name string) (corev1.EnvVar, bool) {
	// The last entry of a name is the one in effect, as in Kubernetes.
	for i := len(c.Env) - 1; i >= 0; i-- {
		if c.Env[i].Name == name {
			return c.Env[i], true
		}
	}
	return corev1.EnvVar{}, false
}

func envValue(t *testing.T, c *corev1.Container, name string) string {
	t.Helper()
	e, ok := envVar(c, name)
	if !ok {
		t.Fatalf("env %s missing; env: %v", name, c.Env)
	}
	if e.ValueFrom != nil {
		t.Fatalf("env %s comes from %v, want a value", name, e.ValueFrom)
	}
	return e.Value
}

func secretRef(t *testing.T, c *corev1.Container, name string) *corev1.SecretKeySelector {
	t.Helper()
	e, ok := envVar(c, name)
	if !ok {
		t.Fatalf("env %s missing; env: %v", name, c.Env)
	}
	if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
		t.Fatalf("env %s must come from a Secret, got %+v", name, e)
	}
	return e.ValueFrom.SecretKeyRef
}

// checkInvariants holds for every set of values: what the issue demands of any install.
func checkInvariants(t *testing.T, r rendered) {
	t.Helper()
	sts := r.sts
	pod := sts.Spec.Template.Spec
	c := container(t, sts)

	// A headless Service is the StatefulSet's serviceName, selecting its pods.
	var headless *corev1.Service
	for _, s := range r.services {
		if s.Name == sts.Spec.ServiceName {
			headless = s
		}
	}
	if headless == nil {
		t.Fatalf("serviceName %q: no such Service rendered", sts.Spec.ServiceName)
	}
	if headless.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s: clusterIP %q, want None (headless)", headless.Name, headless.Spec.ClusterIP)
	}
	for k, v := range headless.Spec.Selector {
		if sts.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not select the pods (labels %v)", k, v, sts.Spec.Template.Labels)
		}
	}
	for k, v := range sts.Spec.Selector.MatchLabels {
		if sts.Spec.Template.Labels[k] != v {
			t.Errorf("StatefulSet selector %s=%s does not match its pod template (labels %v)", k, v, sts.Spec.Template.Labels)
		}
	}

	// RTE_TOKEN only from a Secret, and the Secret the chart makes holds it.
	ref := secretRef(t, c, "RTE_TOKEN")
	for _, s := range r.secrets {
		if s.Name == ref.Name && len(s.Data[ref.Key]) < 16 {
			t.Errorf("Secret %s key %s holds %d bytes, want the token", s.Name, ref.Key, len(s.Data[ref.Key]))
		}
	}
	for _, e := range c.Env {
		if strings.Contains(e.Value, goodToken) {
			t.Errorf("env %s holds a token inline", e.Name)
		}
	}

	// Probes: HTTP GETs of /live and /ready on the RTE's port, in the listener's scheme.
	scheme := corev1.URISchemeHTTP
	if envValue(t, c, "HTTPS") == "1" {
		scheme = corev1.URISchemeHTTPS
	}
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/live"}, {c.ReadinessProbe, "/ready"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Fatalf("probe for %s missing or not an httpGet: %+v", p.path, p.probe)
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || g.Port.String() != "rte" || g.Scheme != scheme {
			t.Errorf("probe %s: got path %s port %s scheme %s, want port rte scheme %s", p.path, g.Path, g.Port.String(), g.Scheme, scheme)
		}
	}

	// The grace period outlasts the drain.
	drain := envValue(t, c, "RTE_DRAIN_SECONDS")
	if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds <= atoi(t, drain) {
		t.Errorf("terminationGracePeriodSeconds %v is not longer than RTE_DRAIN_SECONDS %s", pod.TerminationGracePeriodSeconds, drain)
	}

	// Non-root with a read-only root filesystem, no privilege to gain.
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("container securityContext %+v: want readOnlyRootFilesystem", sc)
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container securityContext %+v: want allowPrivilegeEscalation false", sc)
	}
	nonRoot := (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) ||
		(pod.SecurityContext != nil && pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot)
	if !nonRoot {
		t.Errorf("neither the pod nor the container says runAsNonRoot")
	}

	// Every place the RTE writes is a mount, and every mount has its volume.
	volumes := map[string]bool{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = true
	}
	for _, v := range sts.Spec.VolumeClaimTemplates {
		volumes[v.Name] = true
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		if !volumes[m.Name] {
			t.Errorf("mount %s at %s has no volume", m.Name, m.MountPath)
		}
		mounts[m.MountPath] = m.Name
	}
	writes := []string{envValue(t, c, "RTE_SPOOL_PATH"), envValue(t, c, "RTE_WORK_PATH"), "/tmp", envValue(t, c, "HOME") + "/.ansible"}
	if e, ok := envVar(c, "RTE_CACHE_PATH"); ok {
		writes = append(writes, e.Value)
	}
	if envValue(t, c, "HTTPS") == "1" {
		writes = append(writes, envValue(t, c, "HTTPS_CERT"), envValue(t, c, "HTTPS_KEY"))
	}
	for _, p := range writes {
		if mountHolding(c, p) == nil {
			t.Errorf("%s is written by the RTE but lies on the read-only root filesystem (mounts %v)", p, mounts)
		}
	}

	// What must survive a restart is on the pod's claim, at the image's VOLUME paths.
	if len(sts.Spec.VolumeClaimTemplates) > 0 {
		keep := []string{envValue(t, c, "RTE_SPOOL_PATH")}
		if envValue(t, c, "HTTPS") == "1" {
			keep = append(keep, filepath.Dir(envValue(t, c, "HTTPS_CERT")), filepath.Dir(envValue(t, c, "HTTPS_KEY")))
		}
		for _, p := range keep {
			if m := mountHolding(c, p); m == nil || m.Name != sts.Spec.VolumeClaimTemplates[0].Name {
				t.Errorf("%s is on mount %+v, want it on the pod's claim %s", p, m, sts.Spec.VolumeClaimTemplates[0].Name)
			}
		}
	}

	// Each pod is its own runner, at its own address.
	if got := envValue(t, c, "RTE_NAME"); got != "$(POD_NAME)" {
		t.Errorf("RTE_NAME %q, want $(POD_NAME)", got)
	}
	if e, ok := envVar(c, "POD_NAME"); !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("POD_NAME must come from the downward API's metadata.name, got %+v", e)
	}
	if envValue(t, c, "RTE_MODE") == "inbound" {
		want := fmt.Sprintf("://$(POD_NAME).%s.%s.svc", sts.Spec.ServiceName, namespace)
		if u := envValue(t, c, "RTE_URL"); !strings.Contains(u, want) {
			t.Errorf("RTE_URL %q does not contain the pod's own address %q", u, want)
		}
	} else if _, ok := envVar(c, "RTE_URL"); ok {
		t.Errorf("RTE_URL set in outbound mode, where the RTE warns that it is unused")
	}
}

// mountAt returns the container's mount at exactly path, or nil.
func mountAt(c *corev1.Container, path string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == path {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

// mountHolding returns the container's mount that holds path (the deepest), or nil.
func mountHolding(c *corev1.Container, path string) *corev1.VolumeMount {
	var best *corev1.VolumeMount
	for i := range c.VolumeMounts {
		m := &c.VolumeMounts[i]
		if (path == m.MountPath || strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")) &&
			(best == nil || len(m.MountPath) > len(best.MountPath)) {
			best = m
		}
	}
	return best
}

func atoi(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("%q is not a number: %v", s, err)
	}
	return n
}

func TestLint(t *testing.T) {
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	l := action.NewLint()
	l.Strict = true // warnings count as failures
	l.Namespace = namespace
	l.KubeVersion = kv
	res := l.Run([]string{"."}, map[string]any{"token": map[string]any{"value": goodToken}})
	if len(res.Errors) > 0 || res.TotalChartsLinted != 1 {
		t.Errorf("lint with a token: %d chart(s) linted, errors %v; messages %v", res.TotalChartsLinted, res.Errors, res.Messages)
	}
	// Lint renders with "fail" and "required" turned into log lines (Helm's lint mode), so the
	// refusals of missing values are checked by TestSchemaRefusals through an install instead.
}

// values builds a values tree from dotted paths, as "helm install --set a.b=c" does.
func values(t *testing.T, kv ...any) map[string]any {
	t.Helper()
	out := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		path := strings.Split(kv[i].(string), ".")
		m := out
		for _, p := range path[:len(path)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[path[len(path)-1]] = kv[i+1]
	}
	return out
}

func TestRenderMatrix(t *testing.T) {
	cases := []struct {
		name  string
		vals  map[string]any
		check func(t *testing.T, r rendered)
	}{{
		name: "defaults with a token",
		vals: values(t, "token.value", goodToken),
		check: func(t *testing.T, r rendered) {
			c := container(t, r.sts)
			if got, want := envValue(t, c, "RTE_URL"), "https://$(POD_NAME).rte.automation.svc:8000"; got != want {
				t.Errorf("RTE_URL %q, want %q", got, want)
			}
			if _, ok := envVar(c, "APP_URL"); ok {
				t.Errorf("APP_URL set without appUrl")
			}
			if len(r.sts.Spec.VolumeClaimTemplates) != 1 || r.sts.Spec.VolumeClaimTemplates[0].Name != "data" {
				t.Errorf("volumeClaimTemplates %v, want one named data", r.sts.Spec.VolumeClaimTemplates)
			}
			if p := r.sts.Spec.PersistentVolumeClaimRetentionPolicy; p == nil || p.WhenDeleted != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
				t.Errorf("claim retention %+v, want Retain: the claims hold the pinned certificates", p)
			}
			if got := *r.sts.Spec.Template.Spec.TerminationGracePeriodSeconds; got != 45 {
				t.Errorf("terminationGracePeriodSeconds %d, want drainSeconds 25 + 20", got)
			}
			if len(r.secrets) != 1 || string(r.secrets[0].Data["token"]) != goodToken || len(r.secrets[0].Data) != 1 {
				t.Errorf("Secrets %v, want one holding only the token", r.secrets)
			}
			if len(r.pdbs)+len(r.policies)+len(r.claims) != 0 || r.serviceMonitor != nil {
				t.Errorf("toggles off, yet rendered %d PDB, %d NetworkPolicy, %d claims, ServiceMonitor %v", len(r.pdbs), len(r.policies), len(r.claims), r.serviceMonitor != nil)
			}
			if c.Image != "rte:dev" {
				t.Errorf("image %q, want rte:dev (the chart's appVersion)", c.Image)
			}
			if !strings.Contains(r.notes, "add each runner at the app by hand") || !strings.Contains(r.notes, "kubectl -n automation logs rte-0 |") {
				t.Errorf("NOTES do not say how to add the runner without appUrl:\n%s", r.notes)
			}
		},
	}, {
		name: "inbound registering, approved by hand",
		vals: values(t, "token.value", goodToken, "appUrl", "https://forms.example.com", "replicas", 2,
			"image.repository", "registry.example.com/rte", "image.tag", "1.2.3", "port", 9443),
		check: func(t *testing.T, r rendered) {
			c := container(t, r.sts)
			if envValue(t, c, "APP_URL") != "https://forms.example.com" || envValue(t, c, "RTE_URL") != "https://$(POD_NAME).rte.automation.svc:9443" {
				t.Errorf("APP_URL %q RTE_URL %q", envValue(t, c, "APP_URL"), envValue(t, c, "RTE_URL"))
			}
			if c.Image != "registry.example.com/rte:1.2.3" || c.Ports[0].ContainerPort != 9443 || envValue(t, c, "PORT") != "9443" {
				t.Errorf("image %s port %v PORT %s", c.Image, c.Ports, envValue(t, c, "PORT"))
			}
			if _, ok := envVar(c, "RTE_JOIN_TOKEN"); ok {
				t.Errorf("RTE_JOIN_TOKEN set without a join token")
			}
			for _, pod := range []string{"rte-0", "rte-1"} {
				if want := "rte-app approve " + pod + " --fingerprint"; !strings.Contains(r.notes, want) {
					t.Errorf("NOTES do not say %q:\n%s", want, r.notes)
				}
			}
		},
	}, {
		name: "inbound registering, existing Secrets, every toggle on",
		vals: values(t,
			"appUrl", "https://forms.example.com",
			"token.existingSecret", "rte-tokens", "token.existingSecretKey", "rte",
			"joinToken.existingSecret", "rte-tokens", "joinToken.existingSecretKey", "join",
			"metrics.token.existingSecret", "rte-tokens",
			"metrics.serviceMonitor.enabled", true, "metrics.serviceMonitor.labels", map[string]any{"release": "prom"},
			"replicas", 3, "maxJobs", 0, "clusterDomain", "cluster.local",
			"sharedCache.enabled", true, "sharedCache.storageClass", "nfs",
			"persistence.storageClass", "-",
			"networkPolicy.enabled", true,
			"networkPolicy.from", []any{map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"app": "forms"}}}},
			"podDisruptionBudget.enabled", true,
		),
		check: func(t *testing.T, r rendered) {
			c := container(t, r.sts)
			if got, want := envValue(t, c, "RTE_URL"), "https://$(POD_NAME).rte.automation.svc.cluster.local:8000"; got != want {
				t.Errorf("RTE_URL %q, want %q", got, want)
			}
			if ref := secretRef(t, c, "RTE_TOKEN"); ref.Name != "rte-tokens" || ref.Key != "rte" {
				t.Errorf("RTE_TOKEN from %s/%s, want rte-tokens/rte", ref.Name, ref.Key)
			}
			if ref := secretRef(t, c, "RTE_JOIN_TOKEN"); ref.Name != "rte-tokens" || ref.Key != "join" {
				t.Errorf("RTE_JOIN_TOKEN from %s/%s, want rte-tokens/join", ref.Name, ref.Key)
			}
			if ref := secretRef(t, c, "METRICS_TOKEN"); ref.Name != "rte-tokens" || ref.Key != "metrics-token" {
				t.Errorf("METRICS_TOKEN from %s/%s, want rte-tokens/metrics-token", ref.Name, ref.Key)
			}
			if len(r.secrets) != 0 {
				t.Errorf("every token is in an existing Secret, yet the chart made %d", len(r.secrets))
			}
			if envValue(t, c, "RTE_MAX_JOBS") != "0" || *r.sts.Spec.Replicas != 3 {
				t.Errorf("RTE_MAX_JOBS %s replicas %d, want 0 and 3", envValue(t, c, "RTE_MAX_JOBS"), *r.sts.Spec.Replicas)
			}
			if len(r.claims) != 1 || r.claims[0].Spec.AccessModes[0] != corev1.ReadWriteMany || *r.claims[0].Spec.StorageClassName != "nfs" {
				t.Fatalf("shared cache claims %v, want one ReadWriteMany of class nfs", r.claims)
			}
			shared := ""
			for _, v := range r.sts.Spec.Template.Spec.Volumes {
				if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == r.claims[0].Name {
					shared = v.Name
				}
			}
			cache := envValue(t, c, "RTE_CACHE_PATH")
			if m := mountAt(c, cache); shared == "" || m == nil || m.Name != shared || m.SubPath != "" {
				t.Errorf("RTE_CACHE_PATH %s is on mount %+v, want the whole shared claim %s (volume %q)", cache, m, r.claims[0].Name, shared)
			}
			if sc := r.sts.Spec.VolumeClaimTemplates[0].Spec.StorageClassName; sc == nil || *sc != "" {
				t.Errorf("storageClass \"-\" must render storageClassName \"\", got %v", sc)
			}
			sm := r.serviceMonitor
			if sm == nil || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Scheme != "https" ||
				sm.Spec.Endpoints[0].Authorization.Credentials.Name != "rte-tokens" || sm.Metadata.Labels["release"] != "prom" {
				t.Errorf("ServiceMonitor %+v: want one https endpoint authorised from rte-tokens, labelled release=prom", sm)
			}
			if len(r.pdbs) != 1 || r.pdbs[0].Spec.MaxUnavailable.IntValue() != 1 {
				t.Errorf("PDBs %v, want one with maxUnavailable 1", r.pdbs)
			}
			if len(r.policies) != 1 || len(r.policies[0].Spec.Ingress) != 1 || r.policies[0].Spec.Ingress[0].From[0].PodSelector.MatchLabels["app"] != "forms" {
				t.Errorf("NetworkPolicies %+v, want one letting app=forms in", r.policies)
			}
			for i := range 3 {
				if want := fmt.Sprintf("https://rte-%d.rte.automation.svc.cluster.local:8000", i); !strings.Contains(r.notes, want) {
					t.Errorf("NOTES do not list pod %d's address %s:\n%s", i, want, r.notes)
				}
			}
			if !strings.Contains(r.notes, "join token") {
				t.Errorf("NOTES do not say the join token approves the pods:\n%s", r.notes)
			}
		},
	}, {
		name: "outbound over http, local files, no persistence, extras",
		vals: values(t,
			"mode", "outbound", "appUrl", "https://forms.example.com/af", "https", false,
			"token.value", goodToken, "joinToken.value", "join-token-of-the-app", "metrics.token.value", "metrics-token-value",
			"files", "local", "localFiles.ansiblePath", "/srv/ansible", "localFiles.repoPath", "/srv/repos",
			"persistence.enabled", false, "drainSeconds", 90, "terminationGracePeriodSeconds", 120,
			"extraEnv", []any{map[string]any{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}},
			"extraVolumes", []any{map[string]any{"name": "playbooks", "configMap": map[string]any{"name": "site"}}},
			"extraVolumeMounts", []any{map[string]any{"name": "playbooks", "mountPath": "/srv/ansible", "readOnly": true}},
			"resources", map[string]any{"requests": map[string]any{"cpu": "250m", "memory": "256Mi"}},
			"nodeSelector", map[string]any{"zone": "dmz"},
			"tolerations", []any{map[string]any{"key": "dmz", "operator": "Exists", "effect": "NoSchedule"}},
			"affinity", map[string]any{"podAntiAffinity": map[string]any{"preferredDuringSchedulingIgnoredDuringExecution": []any{
				map[string]any{"weight": 100, "podAffinityTerm": map[string]any{"topologyKey": "kubernetes.io/hostname",
					"labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "rte"}}}}}}},
			"networkPolicy.enabled", true,
			"fullnameOverride", "dmz-runner",
		),
		check: func(t *testing.T, r rendered) {
			c := container(t, r.sts)
			pod := r.sts.Spec.Template.Spec
			if envValue(t, c, "RTE_MODE") != "outbound" || envValue(t, c, "APP_URL") != "https://forms.example.com/af" || envValue(t, c, "HTTPS") != "0" {
				t.Errorf("env %v: want outbound to https://forms.example.com/af without TLS", c.Env)
			}
			if _, ok := envVar(c, "HTTPS_CERT"); ok {
				t.Errorf("HTTPS_CERT set with https off")
			}
			if envValue(t, c, "ANSIBLE_PATH") != "/srv/ansible" || envValue(t, c, "REPO_PATH") != "/srv/repos" || envValue(t, c, "RTE_FILES") != "local" {
				t.Errorf("local files env wrong: %v", c.Env)
			}
			if _, ok := envVar(c, "RTE_CACHE_PATH"); ok {
				t.Errorf("RTE_CACHE_PATH set with files: local")
			}
			if envValue(t, c, "HTTPS_PROXY") != "http://proxy:3128" {
				t.Errorf("extraEnv HTTPS_PROXY missing")
			}
			if len(r.sts.Spec.VolumeClaimTemplates) != 0 || r.sts.Spec.PersistentVolumeClaimRetentionPolicy != nil {
				t.Errorf("persistence off, yet claims %v", r.sts.Spec.VolumeClaimTemplates)
			}
			if *pod.TerminationGracePeriodSeconds != 120 || r.sts.Name != "dmz-runner" || r.sts.Spec.ServiceName != "dmz-runner" {
				t.Errorf("grace %d name %s service %s, want 120, dmz-runner, dmz-runner", *pod.TerminationGracePeriodSeconds, r.sts.Name, r.sts.Spec.ServiceName)
			}
			if c.Resources.Requests.Memory().String() != "256Mi" || pod.NodeSelector["zone"] != "dmz" || len(pod.Tolerations) != 1 ||
				pod.Affinity == nil || pod.Affinity.PodAntiAffinity == nil {
				t.Errorf("resources %v nodeSelector %v tolerations %v affinity %v not passed through", c.Resources, pod.NodeSelector, pod.Tolerations, pod.Affinity)
			}
			if len(r.policies) != 1 || len(r.policies[0].Spec.Ingress) != 0 || slices.Contains(r.policies[0].Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
				t.Errorf("outbound NetworkPolicy %+v: want ingress closed, egress open", r.policies)
			}
			if len(r.secrets) != 1 || len(r.secrets[0].Data) != 3 {
				t.Errorf("Secrets %v, want one with token, join-token and metrics-token", r.secrets)
			}
			if !strings.Contains(r.notes, "WARNING: persistence.enabled is false") || !strings.Contains(r.notes, "Outbound") {
				t.Errorf("NOTES miss the outbound text or the persistence warning:\n%s", r.notes)
			}
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rel, err := install(t, tc.vals)
			if err != nil {
				t.Fatalf("install: %v", err)
			}
			r := decode(t, rel)
			checkInvariants(t, r)
			tc.check(t, r)
		})
	}
}

func TestSchemaRefusals(t *testing.T) {
	cases := []struct {
		name string
		vals map[string]any
		want []string // each must appear in the error
	}{
		{"no token", nil, []string{"token.existingSecret", "token.value"}},
		{"empty token block", values(t, "token.value", "", "token.existingSecret", ""), []string{"token.existingSecret"}},
		{"short token", values(t, "token.value", "short"), []string{"token.value", "16"}},
		{"both tokens", values(t, "token.value", goodToken, "token.existingSecret", "s"), []string{"not both"}},
		{"bad mode", values(t, "token.value", goodToken, "mode", "database"), []string{"/mode", "inbound", "outbound"}},
		{"negative maxJobs", values(t, "token.value", goodToken, "maxJobs", -1), []string{"/maxJobs", "minimum"}},
		{"negative drainSeconds", values(t, "token.value", goodToken, "drainSeconds", -5), []string{"/drainSeconds"}},
		{"maxJobs not a number", values(t, "token.value", goodToken, "maxJobs", "ten"), []string{"/maxJobs"}},
		{"bad files", values(t, "token.value", goodToken, "files", "nfs"), []string{"/files", "transfer"}},
		{"misspelt value", values(t, "token.value", goodToken, "replica", 2), []string{"replica"}},
		{"port out of range", values(t, "token.value", goodToken, "port", 70000), []string{"/port"}},
		{"size with a wrong unit", values(t, "token.value", goodToken, "persistence.size", "2GB"), []string{"/persistence/size"}},
		{"appUrl not http", values(t, "token.value", goodToken, "appUrl", "ftp://forms"), []string{"/appUrl"}},
		{"outbound without appUrl", values(t, "token.value", goodToken, "mode", "outbound"), []string{"appUrl: required with mode: outbound"}},
		{"join token without appUrl", values(t, "token.value", goodToken, "joinToken.value", "join-token-of-the-app"), []string{"joinToken", "appUrl"}},
		{"grace not above drain", values(t, "token.value", goodToken, "drainSeconds", 60, "terminationGracePeriodSeconds", 60), []string{"terminationGracePeriodSeconds: 60 is not longer than drainSeconds (60)"}},
		{"local without paths", values(t, "token.value", goodToken, "files", "local"), []string{"localFiles.ansiblePath"}},
		{"serviceMonitor without metrics token", values(t, "token.value", goodToken, "metrics.serviceMonitor.enabled", true), []string{"metrics.token.value"}},
		{"inbound networkPolicy letting nothing in", values(t, "token.value", goodToken, "networkPolicy.enabled", true), []string{"networkPolicy.from"}},
		{"shared cache with local files", values(t, "token.value", goodToken, "files", "local", "localFiles.ansiblePath", "/a", "localFiles.repoPath", "/r", "sharedCache.enabled", true), []string{"sharedCache.enabled"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := install(t, tc.vals)
			if err == nil {
				t.Fatalf("install succeeded; want a refusal naming %q", tc.want)
			}
			t.Logf("refused: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}
