package examples

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"github.com/narwhal-llm/narwhal/config"
)

// The Kubernetes examples run hardened (docs/security.md, "Deploying"): every pod as a non-root
// user under the runtime's seccomp profile, every container without privilege escalation, with a
// read-only root and no capability; images pinned to a release (never latest); no service-account
// token where nothing calls the API server; a Role that reaches only its own Lease and state
// ConfigMap and lists no ConfigMap; the admin token from a mounted Secret, never in the config.
func TestManifestsHardened(t *testing.T) {
	decode := serializer.NewCodecFactory(apiTypes(t)).UniversalDeserializer()
	unpinned := regexp.MustCompile(`(:latest|-latest)$|^[^:@]+$`)
	var deployments, roles int
	for _, m := range manifests(t) {
		obj, _, err := decode.Decode(m.doc, nil, nil)
		if err != nil {
			continue // TestManifestsDecodeStrictly reports it
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			deployments++
			for _, p := range hardenPod(o.Spec.Template.Spec, unpinned) {
				t.Errorf("%s: Deployment %s: %s", m.file, o.Name, p)
			}
		case *rbacv1.Role:
			roles++
			for _, r := range o.Rules {
				for _, res := range r.Resources {
					if res != "leases" && res != "configmaps" {
						continue
					}
					if slices.Contains(r.Verbs, "list") {
						t.Errorf("%s: Role %s lists %s: nothing calls it", m.file, o.Name, res)
					}
					if len(r.ResourceNames) == 0 && !slices.Equal(r.Verbs, []string{"create"}) {
						t.Errorf("%s: Role %s: %v on every %s of the namespace; name them (resourceNames)", m.file, o.Name, r.Verbs, res)
					}
				}
			}
		case *corev1.ConfigMap:
			if y := o.Data["narwhal.yaml"]; y != "" {
				cfg, err := config.Load([]byte(y))
				if err != nil {
					continue // TestManifestsDecodeStrictly reports it
				}
				if cfg.Admin.Token != "" || cfg.Admin.TokenFile == "" || !strings.Contains(string(mustRead(t, m.file)), "mountPath: "+dirOf(cfg.Admin.TokenFile)+", readOnly: true") {
					t.Errorf("%s: the admin token must come from a Secret mounted where admin.token_file reads it: %+v", m.file, cfg.Admin)
				}
			}
		}
	}
	if deployments == 0 || roles == 0 {
		t.Fatalf("%d Deployments, %d Roles: nothing checked", deployments, roles)
	}
	// The checks can fail: an unhardened pod is caught.
	if p := hardenPod(corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "envoyproxy/envoy:v1.36-latest"}}}, unpinned); len(p) < 5 {
		t.Fatalf("an unhardened pod passed: %v", p)
	}
}

// hardenPod lists what a pod spec lacks of the hardening above.
func hardenPod(p corev1.PodSpec, unpinned *regexp.Regexp) []string {
	var out []string
	sc := p.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		out = append(out, "the pod does not run as a non-root user (securityContext.runAsNonRoot, runAsUser)")
	}
	if sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		out = append(out, "no seccompProfile RuntimeDefault")
	}
	if p.ServiceAccountName == "" && (p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken) {
		out = append(out, "mounts a service-account token it never uses (automountServiceAccountToken: false)")
	}
	for _, c := range append(slices.Clone(p.InitContainers), p.Containers...) {
		if unpinned.MatchString(c.Image) {
			out = append(out, fmt.Sprintf("container %s: image %s is not pinned to a release", c.Name, c.Image))
		}
		cs := c.SecurityContext
		if cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation {
			out = append(out, fmt.Sprintf("container %s: allowPrivilegeEscalation is not false", c.Name))
		}
		if cs == nil || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem {
			out = append(out, fmt.Sprintf("container %s: the root filesystem is writable", c.Name))
		}
		if cs == nil || cs.Capabilities == nil || !slices.Contains(cs.Capabilities.Drop, "ALL") || len(cs.Capabilities.Add) > 0 {
			out = append(out, fmt.Sprintf("container %s: capabilities not all dropped", c.Name))
		}
	}
	return out
}

func dirOf(path string) string { return path[:strings.LastIndex(path, "/")] }

// The Dockerfile's base images are pinned by digest (a tag moves; the digest decides which image
// is built on), each with its tag beside it.
func TestDockerfilePinsItsBases(t *testing.T) {
	pinned := regexp.MustCompile(`^FROM [^\s@]+:[^\s@]+@sha256:[0-9a-f]{64}(\s|$)`)
	n := 0
	for _, line := range strings.Split(string(mustRead(t, "../Dockerfile")), "\n") {
		if !strings.HasPrefix(line, "FROM ") {
			continue
		}
		n++
		if !pinned.MatchString(line) {
			t.Errorf("Dockerfile: %q is not pinned by digest (FROM image:tag@sha256:...)", line)
		}
	}
	if n == 0 {
		t.Fatal("no FROM line in the Dockerfile")
	}
}
