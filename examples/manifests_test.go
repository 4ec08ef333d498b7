// Package examples holds Narwhal's example deployments; its tests check them.
package examples

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/yaml"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/discovery"
	"github.com/narwhal-llm/narwhal/envoy/bootstrap"
)

// manifest is one document of an example's YAML.
type manifest struct {
	file string
	doc  []byte
	obj  *unstructured.Unstructured
}

// manifests reads every document of the Kubernetes examples.
func manifests(t *testing.T) []manifest {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	deeper, _ := filepath.Glob("kubernetes/*/*.yaml")
	files = append(files, deeper...)
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var out []manifest
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, "-patch.yaml") {
			continue // a patch, not an object (TestLLMDExample reads it)
		}
		for _, doc := range bytes.Split(data, []byte("\n---\n")) {
			doc = append(doc, '\n') // the separator took the document's last line end
			var m map[string]any
			if err := yaml.Unmarshal(doc, &m); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if m == nil {
				continue
			}
			out = append(out, manifest{file: f, doc: doc, obj: &unstructured.Unstructured{Object: m}})
		}
	}
	return out
}

// apiTypes are the Kubernetes API groups the manifests use: a manifest of another group fails
// to decode until its group is added here. (client-go's kubernetes/scheme knows every group,
// and brings every one into this test's build.)
func apiTypes(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// Every manifest decodes strictly into its Kubernetes API type (an unknown or misplaced field
// is an error); the InferencePool names a selector and ports Narwhal can use; the Narwhal config
// in the ConfigMap loads.
func TestManifestsDecodeStrictly(t *testing.T) {
	strict := serializer.NewCodecFactory(apiTypes(t), serializer.EnableStrict).UniversalDeserializer()
	kinds := map[string]bool{}
	configs, bootstraps := map[string]*config.Config{}, map[string]string{}
	for _, m := range manifests(t) {
		kind := m.obj.GetKind()
		kinds[kind] = true
		if kind == "InferencePool" {
			if _, err := discovery.PoolMembers(m.obj); err != nil {
				t.Errorf("%s: %v", m.file, err)
			}
			continue
		}
		if kind == "DestinationRule" { // Istio's: checked by TestLLMDExample and on the API server
			continue
		}
		obj, _, err := strict.Decode(m.doc, nil, nil)
		if err != nil {
			t.Errorf("%s: %s %s: %v", m.file, kind, m.obj.GetName(), err)
			continue
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Data["envoy.yaml"] != "" {
			bootstraps[m.file] = cm.Data["envoy.yaml"]
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Data["narwhal.yaml"] != "" {
			cfg, err := config.Load([]byte(cm.Data["narwhal.yaml"]))
			if err != nil {
				t.Errorf("%s: the Narwhal config: %v", m.file, err)
				continue
			}
			if !cfg.Discovery.Kubernetes.Enabled() || !cfg.HA.Enabled() {
				t.Errorf("%s: the config takes its engines from Kubernetes and elects on a Lease: %+v %+v", m.file, cfg.Discovery.Kubernetes, cfg.HA)
			}
			// TLS on ext_proc and admin, from a Secret mounted where the config reads it.
			if !cfg.TLS.ExtProc.Enabled() || !cfg.TLS.Admin.Enabled() || !strings.HasPrefix(cfg.TLS.ExtProc.CertFile, "/etc/narwhal/tls/") ||
				!bytes.Contains(mustRead(t, m.file), []byte("{name: tls, mountPath: /etc/narwhal/tls, readOnly: true}")) {
				t.Errorf("%s: the config serves ext_proc or admin without TLS from the volume at /etc/narwhal/tls: %+v", m.file, cfg.TLS)
			}
			configs[m.file] = cfg
		}
		var _ runtime.Object = obj
	}
	// An Envoy bootstrap beside a Narwhal config is what narwhal envoy-config writes for it, and
	// validates against it.
	for file, bs := range bootstraps {
		cfg := configs[file]
		if cfg == nil {
			t.Errorf("%s: an Envoy bootstrap without a Narwhal config", file)
			continue
		}
		o := bootstrap.Options{NarwhalHosts: []string{"narwhal." + cfg.HA.Kubernetes.Namespace + ".svc.cluster.local"}}
		if cfg.TLS.ExtProc.Enabled() || cfg.TLS.XDS.Enabled() { // the Secret envoy-tls, mounted at /etc/envoy/tls
			o.TLS = bootstrap.ClientTLS{CAFile: "/etc/envoy/tls/ca.crt", CertFile: "/etc/envoy/tls/tls.crt", KeyFile: "/etc/envoy/tls/tls.key"}
		}
		want, err := bootstrap.Generate(cfg, o)
		if err != nil {
			t.Fatal(err)
		}
		if bs != string(want) {
			i := 0
			for i < len(bs) && i < len(want) && bs[i] == want[i] {
				i++
			}
			t.Errorf("%s: the Envoy bootstrap is not what narwhal envoy-config writes for its config: regenerate it (they differ from byte %d: %q)", file, i, bs[max(0, i-40):min(len(bs), i+40)])
		}
		for _, p := range bootstrap.Validate([]byte(bs), cfg) {
			t.Errorf("%s: envoy.yaml line %d: %s", file, p.Line, p)
		}
	}
	if len(bootstraps) == 0 {
		t.Error("no Envoy bootstrap among the manifests")
	}
	for _, k := range []string{"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service", "InferencePool"} {
		if !kinds[k] {
			t.Errorf("no %s among the manifests", k)
		}
	}
	// A misplaced field is caught: the check can fail.
	if _, _, err := strict.Decode([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selectr: {a: b}}\n"), nil, nil); err == nil || !strings.Contains(err.Error(), "selectr") {
		t.Fatalf("strict decoding let an unknown field through: %v", err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The llm-d example (docs/kubernetes.md, "Swapping llm-d's picker for Narwhal") fits llm-d's P/D
// guide as it installs: the InferencePool it patches is the guide's, the patch names the Service
// the file creates, and the picker's ports are llm-d's (ext_proc 9002, gRPC health 9003, metrics
// 9090); the role label is not written (modelservice selects on it), the decode pods are probed
// through their sidecar; the Deployment is recreated, not rolled; Istio reaches the Service over
// TLS without checking its self-made certificate.
func TestLLMDExample(t *testing.T) {
	var cfg *config.Config
	var svcPorts, dr []string
	var strategy string
	for _, m := range manifests(t) {
		if !strings.Contains(m.file, "llm-d/") {
			continue
		}
		switch m.obj.GetKind() {
		case "ConfigMap":
			y, _, _ := unstructured.NestedString(m.obj.Object, "data", "narwhal.yaml")
			var err error
			if cfg, err = config.Load([]byte(y)); err != nil {
				t.Fatal(err)
			}
		case "Service":
			ports, _, _ := unstructured.NestedSlice(m.obj.Object, "spec", "ports")
			for _, p := range ports {
				pm := p.(map[string]any)
				svcPorts = append(svcPorts, fmt.Sprint(pm["name"], ":", pm["port"]))
			}
			if m.obj.GetName() != "narwhal-epp" {
				t.Errorf("Service %s", m.obj.GetName())
			}
		case "Deployment":
			strategy, _, _ = unstructured.NestedString(m.obj.Object, "spec", "strategy", "type")
		case "DestinationRule":
			host, _, _ := unstructured.NestedString(m.obj.Object, "spec", "host")
			mode, _, _ := unstructured.NestedString(m.obj.Object, "spec", "trafficPolicy", "tls", "mode")
			skip, _, _ := unstructured.NestedBool(m.obj.Object, "spec", "trafficPolicy", "tls", "insecureSkipVerify")
			dr = append(dr, host, mode, fmt.Sprint(skip))
		}
	}
	if cfg == nil {
		t.Fatal("no Narwhal config in the llm-d example")
	}
	k := cfg.Discovery.Kubernetes
	if k.Namespace != "llm-d-pd" || k.InferencePool != "gaie-pd" || k.WriteRoleLabel || cfg.Health.Path != "/v1/models" {
		t.Errorf("discovery %+v, health.path %s", k, cfg.Health.Path)
	}
	if cfg.Listen.ExtProc != "0.0.0.0:9002" || cfg.Listen.Health != "0.0.0.0:9003" || cfg.Listen.Admin != "0.0.0.0:9090" {
		t.Errorf("listen %+v: want llm-d's picker ports", cfg.Listen)
	}
	if want := []string{"grpc-ext-proc:9002", "grpc-health:9003", "http-metrics:9090"}; !slices.Equal(svcPorts, want) {
		t.Errorf("Service ports %v, want %v", svcPorts, want)
	}
	if strategy != "Recreate" {
		t.Errorf("Deployment strategy %q: only the leader is Ready, a rolling update never completes", strategy)
	}
	if want := []string{"narwhal-epp.llm-d-pd.svc.cluster.local", "SIMPLE", "true"}; !slices.Equal(dr, want) {
		t.Errorf("DestinationRule %v, want %v", dr, want)
	}
	var patch map[string]any
	if err := yaml.Unmarshal(mustRead(t, "kubernetes/llm-d/inferencepool-patch.yaml"), &patch); err != nil {
		t.Fatal(err)
	}
	ref, _, _ := unstructured.NestedMap(patch, "spec", "endpointPickerRef")
	if ref["name"] != "narwhal-epp" || fmt.Sprint(ref["port"]) != "map[number:9002]" {
		t.Errorf("the InferencePool patch names %v", ref)
	}
}
