package bootstrap_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/envoy/bootstrap"
)

// -update rewrites the generated example Envoy configs under examples/envoy. The flag is
// registered only if no other test file of the package has registered it.
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite golden files (examples/envoy/*.yaml)")
	}
}

func updating() bool {
	f := flag.Lookup("update")
	if f == nil {
		return false
	}
	v, _ := strconv.ParseBool(f.Value.String())
	return v
}

const examplesDir = "../../examples"

func defaultConfig(t testing.TB) *config.Config {
	t.Helper()
	cfg, err := config.LoadDefault()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func composeConfig(t testing.TB) *config.Config { return loadExample(t, "narwhal-compose.yaml") }

// haComposeConfig is the replicas' config of examples/docker-compose-ha.yaml.
func haComposeConfig(t testing.TB) *config.Config { return loadExample(t, "narwhal-ha-compose.yaml") }

func loadExample(t testing.TB, name string) *config.Config {
	t.Helper()
	cfg, err := config.LoadFile(filepath.Join(examplesDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// haComposeOptions are the options of examples/envoy/envoy-ha-compose.yaml: two replicas.
var haComposeOptions = bootstrap.Options{NarwhalHosts: []string{"narwhal-a", "narwhal-b"}, TLS: composeTLS}

// composeTLS are Envoy's certificate files in the compose examples: the narwhal-tls volume
// `narwhal certs` writes, mounted at /etc/envoy/tls.
var composeTLS = bootstrap.ClientTLS{CAFile: "/etc/envoy/tls/ca.crt", CertFile: "/etc/envoy/tls/envoy.crt", KeyFile: "/etc/envoy/tls/envoy.key"}

// composeOptions are the options of examples/envoy/envoy-compose.yaml: Narwhal is the compose
// service "narwhal"; Envoy's admin stays on its container's loopback (the default).
var composeOptions = bootstrap.Options{NarwhalHosts: []string{"narwhal"}, TLS: composeTLS}

// generated lists every generated example: its file, the Narwhal config it is for, and the
// options it was generated with.
func generated(t testing.TB) []struct {
	file string
	cfg  *config.Config
	opts bootstrap.Options
} {
	return []struct {
		file string
		cfg  *config.Config
		opts bootstrap.Options
	}{
		{"envoy/envoy.yaml", defaultConfig(t), bootstrap.Options{}},
		{"envoy/envoy-full-duplex.yaml", defaultConfig(t), bootstrap.Options{BodyMode: bootstrap.BodyFullDuplex}},
		{"envoy/envoy-compose.yaml", composeConfig(t), composeOptions},
		{"envoy/envoy-ha-compose.yaml", haComposeConfig(t), haComposeOptions},
	}
}

// TestExamplesGenerated regenerates every example Envoy config and compares it byte for byte
// (go test ./envoy/bootstrap -run TestExamplesGenerated -update rewrites them).
func TestExamplesGenerated(t *testing.T) {
	for _, g := range generated(t) {
		t.Run(g.file, func(t *testing.T) {
			out, err := bootstrap.Generate(g.cfg, g.opts)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(examplesDir, g.file)
			if updating() {
				if err := os.WriteFile(path, out, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./envoy/bootstrap -run TestExamplesGenerated -update)", err)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("%s is not what Bootstrap generates; run go test ./envoy/bootstrap -run TestExamplesGenerated -update\n%s", path, firstDiff(string(want), string(out)))
			}
		})
	}
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < max(len(al), len(bl)); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return "line " + strconv.Itoa(i+1) + ":\n  file:      " + x + "\n  generated: " + y
		}
	}
	return ""
}

// TestExamplesValidate checks every YAML file under examples/: each Envoy config validates
// with no problem against its Narwhal config, the Narwhal config loads, and the compose file
// is consistent with both. A YAML file the test does not know fails it.
func TestExamplesValidate(t *testing.T) {
	cfgFor := map[string]*config.Config{}
	for _, g := range generated(t) {
		cfgFor[g.file] = g.cfg
	}
	err := filepath.WalkDir(examplesDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return err
		}
		rel, _ := filepath.Rel(examplesDir, path)
		rel = filepath.ToSlash(rel)
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(rel, "envoy/"):
			cfg, ok := cfgFor[rel]
			if !ok {
				t.Errorf("%s: an Envoy config the test does not know; add it to generated()", rel)
				return nil
			}
			for _, p := range bootstrap.Validate(data, cfg) {
				t.Errorf("%s: line %d: %s", rel, p.Line, p)
			}
			for _, p := range bootstrap.Validate(data, nil) {
				t.Errorf("%s (no Narwhal config): line %d: %s", rel, p.Line, p)
			}
		case rel == "narwhal-compose.yaml", rel == "narwhal-ha-compose.yaml", strings.HasPrefix(rel, "sim/"): // Narwhal configs
			if _, err := config.Load(data); err != nil {
				t.Errorf("%s: %v", rel, err)
			}
		case strings.HasPrefix(rel, "kubernetes/"): // Kubernetes manifests: examples/manifests_test.go
		case strings.HasPrefix(rel, "testdata/"): // the examples' tests' CRDs: installed by examples/manifests_kubernetes_test.go
		case rel == "docker-compose.yaml":
			checkCompose(t, data)
		case rel == "docker-compose-ha.yaml":
			checkHACompose(t, data)
		case rel == "prometheus/prometheus.yml", strings.HasPrefix(rel, "grafana/provisioning/"): // checked with docker-compose.yaml
			var v map[string]any
			if err := yaml.Unmarshal(data, &v); err != nil {
				t.Errorf("%s: %v", rel, err)
			}
		default:
			t.Errorf("%s: a YAML file the test does not know", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

type composeFile struct {
	Services map[string]struct {
		Image   string            `yaml:"image"`
		Build   map[string]string `yaml:"build"`
		Command []string          `yaml:"command"`
		Volumes []string          `yaml:"volumes"`
		Ports   []string          `yaml:"ports"`
		// Environment is written as a mapping in the examples.
		Environment map[string]string `yaml:"environment"`
	} `yaml:"services"`
}

// checkComposeExposure checks what a compose example opens (docs/security.md): every port
// published on the host's loopback only (the admin API, Envoy's listener, Prometheus and Grafana
// are not for the network the host is on), Envoy's admin (/quitquitquit among its calls)
// published nowhere, and the admin token the one the certs service writes into the volume
// (narwhal certs --admin-token), no default in a file.
func checkComposeExposure(t *testing.T, name string, cf composeFile, cfg *config.Config) {
	t.Helper()
	for svcName, svc := range cf.Services {
		for _, p := range svc.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("%s: services.%s publishes %q on every interface; bind it to 127.0.0.1", name, svcName, p)
			}
			if strings.HasSuffix(p, ":9901") {
				t.Errorf("%s: services.%s publishes Envoy's admin (%s)", name, svcName, p)
			}
		}
	}
	if certs := strings.Join(cf.Services["certs"].Command, " "); !strings.Contains(certs, "--admin-token") ||
		!strings.HasPrefix(cfg.Admin.TokenFile, "/etc/narwhal/tls/") || cfg.Admin.TokenEnv != "" || cfg.Admin.Token != "" {
		t.Errorf("%s: the admin token is not the one certs --admin-token writes (certs: %q, admin %+v)", name, certs, cfg.Admin)
	}
}

// checkComposeTLS checks the TLS wiring of a compose example whose Narwhal config is cfg: a
// certs service writes `narwhal certs` into the narwhal-tls volume, for every host Envoy dials;
// each Narwhal service mounts it where tls.* reads; Envoy mounts it where the bootstrap's files
// are, and runs as the keys' owner.
func checkComposeTLS(t *testing.T, name string, cf composeFile, cfg *config.Config, o bootstrap.Options) {
	t.Helper()
	dir := filepath.Dir(cfg.TLS.ExtProc.CertFile)
	if !cfg.TLS.ExtProc.Mutual() || !cfg.TLS.XDS.Mutual() || !cfg.TLS.Admin.Enabled() {
		t.Errorf("%s: the config does not serve (mutual) TLS on every listener: %+v", name, cfg.TLS)
	}
	for _, f := range []string{cfg.TLS.ExtProc.KeyFile, cfg.TLS.ExtProc.ClientCAFile, cfg.TLS.XDS.CertFile, cfg.TLS.Admin.CertFile} {
		if filepath.Dir(f) != dir {
			t.Errorf("%s: %s is not in %s, where the certs volume mounts", name, f, dir)
		}
	}
	certs := strings.Join(cf.Services["certs"].Command, " ")
	if !strings.HasPrefix(certs, "certs --dir "+dir+" --hosts ") {
		t.Errorf("%s: services.certs.command is %q, want certs --dir %s --hosts ...", name, certs, dir)
	}
	var hosts []string
	if args := cf.Services["certs"].Command; slices.Contains(args, "--hosts") {
		if i := slices.Index(args, "--hosts"); i+1 < len(args) {
			hosts = strings.Split(args[i+1], ",")
		}
	}
	for _, h := range o.NarwhalHosts {
		if !slices.Contains(hosts, h) {
			t.Errorf("%s: the certificate is for %v, not for %s, the host Envoy dials", name, hosts, h)
		}
		if !slices.Contains(cf.Services[h].Volumes, "narwhal-tls:"+dir+":ro") {
			t.Errorf("%s: services.%s does not mount narwhal-tls at %s", name, h, dir)
		}
	}
	ev := cf.Services["envoy"]
	if !slices.Contains(ev.Volumes, "narwhal-tls:"+filepath.Dir(o.TLS.CAFile)+":ro") || ev.Environment["ENVOY_UID"] != "65532" {
		t.Errorf("%s: envoy does not mount narwhal-tls at %s as the keys' owner (volumes %v, env %v)", name, filepath.Dir(o.TLS.CAFile), ev.Volumes, ev.Environment)
	}
}

// checkCompose checks that examples/docker-compose.yaml parses and names services, files and
// ports consistently with the Narwhal config and the Envoy config it mounts (no Docker engine
// runs in tests, so this is as far as it can be checked).
func checkCompose(t *testing.T, data []byte) {
	t.Helper()
	var cf composeFile
	if err := yaml.Unmarshal(data, &cf); err != nil {
		t.Fatalf("docker-compose.yaml: %v", err)
	}
	cfg := composeConfig(t)
	mount := func(svc, target string) string {
		for _, v := range cf.Services[svc].Volumes {
			parts := strings.Split(v, ":")
			if len(parts) >= 2 && parts[1] == target {
				if _, err := os.Stat(filepath.Join(examplesDir, parts[0])); err != nil {
					t.Errorf("docker-compose.yaml: services.%s mounts %s, which does not exist", svc, parts[0])
				}
				return filepath.ToSlash(filepath.Clean(parts[0]))
			}
		}
		t.Errorf("docker-compose.yaml: services.%s mounts nothing at %s", svc, target)
		return ""
	}
	published := func(svc string, port int) {
		p := strconv.Itoa(port)
		if !slices.ContainsFunc(cf.Services[svc].Ports, func(s string) bool { return strings.HasSuffix(s, ":"+p) || s == p }) {
			t.Errorf("docker-compose.yaml: services.%s does not publish port %d (ports %v)", svc, port, cf.Services[svc].Ports)
		}
	}
	checkComposeExposure(t, "docker-compose.yaml", cf, cfg)
	port := func(addr string) int {
		i := strings.LastIndexByte(addr, ':')
		n, err := strconv.Atoi(addr[i+1:])
		if err != nil {
			t.Fatalf("bad address %q", addr)
		}
		return n
	}

	// Narwhal: built from the repo Dockerfile, whose CMD reads /etc/narwhal/config.yaml.
	dockerfile, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dockerfile), `"--config", "/etc/narwhal/config.yaml"`) {
		t.Errorf("Dockerfile CMD no longer reads /etc/narwhal/config.yaml; update docker-compose.yaml")
	}
	nw, ok := cf.Services["narwhal"]
	if !ok {
		t.Fatal("docker-compose.yaml: no narwhal service")
	}
	if nw.Build["context"] != ".." {
		t.Errorf("docker-compose.yaml: services.narwhal.build.context is %q, want .. (the repo)", nw.Build["context"])
	}
	if got := mount("narwhal", "/etc/narwhal/config.yaml"); got != "narwhal-compose.yaml" {
		t.Errorf("docker-compose.yaml: narwhal's config is %q, want narwhal-compose.yaml", got)
	}
	published("narwhal", port(cfg.Listen.Admin))

	// Engines: one enginesim service per configured engine, listening on its port.
	for _, e := range cfg.Engines {
		host := e.Address[:strings.LastIndexByte(e.Address, ':')]
		svc, ok := cf.Services[host]
		if !ok {
			t.Errorf("docker-compose.yaml: engine %s is at %s, but there is no service %q", e.ID, e.Address, host)
			continue
		}
		cmd := strings.Join(svc.Command, " ")
		if !strings.HasPrefix(cmd, "enginesim ") || !strings.Contains(cmd, "--listen 0.0.0.0:"+strconv.Itoa(port(e.Address))) ||
			!strings.Contains(cmd, "--role "+e.Role) {
			t.Errorf("docker-compose.yaml: services.%s.command is %q, want enginesim --listen 0.0.0.0:%d --role %s", host, cmd, port(e.Address), e.Role)
		}
		if svc.Image != nw.Image {
			t.Errorf("docker-compose.yaml: services.%s.image is %q, want Narwhal's image %q", host, svc.Image, nw.Image)
		}
	}

	// Envoy: the official image with the generated compose config, its listener and admin published.
	ev, ok := cf.Services["envoy"]
	if !ok {
		t.Fatal("docker-compose.yaml: no envoy service")
	}
	if !strings.HasPrefix(ev.Image, "envoyproxy/envoy:") {
		t.Errorf("docker-compose.yaml: services.envoy.image is %q, want the official envoyproxy/envoy image", ev.Image)
	}
	if got := mount("envoy", "/etc/envoy/envoy.yaml"); got != "envoy/envoy-compose.yaml" {
		t.Errorf("docker-compose.yaml: envoy's config is %q, want envoy/envoy-compose.yaml", got)
	}
	published("envoy", port(bootstrap.DefaultEnvoyListen))
	bs, err := os.ReadFile(filepath.Join(examplesDir, "envoy/envoy-compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`socket_address: {address: "narwhal", port_value: ` + strconv.Itoa(port(cfg.Listen.ExtProc)) + `}`,
		`socket_address: {address: "narwhal", port_value: ` + strconv.Itoa(port(cfg.Listen.XDS)) + `}`,
		`socket_address: {address: "127.0.0.1", port_value: 9901}`,
	} {
		if !strings.Contains(string(bs), want) {
			t.Errorf("envoy-compose.yaml lacks %s", want)
		}
	}

	// Prometheus scrapes Narwhal's admin port and every engine; Grafana is provisioned with it and
	// the dashboard.
	if got := mount("prometheus", "/etc/prometheus/prometheus.yml"); got != "prometheus/prometheus.yml" {
		t.Errorf("docker-compose.yaml: prometheus's config is %q", got)
	}
	var prom struct {
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	pb, err := os.ReadFile(filepath.Join(examplesDir, "prometheus/prometheus.yml"))
	if err != nil || yaml.Unmarshal(pb, &prom) != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	var targets []string
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	// Narwhal's admin answers only to the host names it serves (docs/security.md): the name
	// Prometheus scrapes it by is one of admin.hosts.
	if !slices.Contains(cfg.Admin.Hosts, "narwhal") {
		t.Errorf("prometheus.yml scrapes narwhal:%d, but admin.hosts %v does not name narwhal: every scrape would get 421", port(cfg.Listen.Admin), cfg.Admin.Hosts)
	}
	want := []string{"narwhal:" + strconv.Itoa(port(cfg.Listen.Admin))}
	for _, e := range cfg.Engines {
		want = append(want, e.Address)
	}
	for _, w := range want {
		if !slices.Contains(targets, w) {
			t.Errorf("prometheus.yml scrapes %v, not %s", targets, w)
		}
	}
	checkComposeTLS(t, "docker-compose.yaml", cf, cfg, composeOptions)
	mount("grafana", "/etc/grafana/provisioning")
	if got := mount("grafana", "/var/lib/grafana/dashboards/narwhal.json"); got != "grafana/narwhal.json" {
		t.Errorf("docker-compose.yaml: grafana's dashboard is %q", got)
	}
	published("grafana", 3000)
}

// twoEngines completes a test config (a config lists at least one engine).
const twoEngines = `
engines:
  - {id: e1, address: "127.0.0.1:8001", role: prefill}
  - {id: e2, address: "127.0.0.1:8002", role: decode}
`

func TestBootstrapDeterministic(t *testing.T) {
	cfg := defaultConfig(t)
	a, err := bootstrap.Generate(cfg, bootstrap.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		b, err := bootstrap.Generate(cfg, bootstrap.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Fatal("Bootstrap output differs between calls")
		}
	}
}

// TestBootstrapVariants generates bootstraps for configs and options other than the examples'
// and checks each validates cleanly against its config.
func TestBootstrapVariants(t *testing.T) {
	load := func(t *testing.T, y string) *config.Config {
		t.Helper()
		cfg, err := config.Load([]byte(y + twoEngines))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	cases := []struct {
		name string
		cfg  string
		opts bootstrap.Options
		want []string // substrings of the output
	}{
		{"defaults", "", bootstrap.Options{},
			[]string{"message_timeout: 35s", "per_connection_buffer_limit_bytes: 5242880", "type: STATIC", `port_value: 9002`}},
		{"every interface becomes loopback", "listen: {extproc: \"0.0.0.0:7000\", xds: \":7001\"}\n", bootstrap.Options{},
			[]string{`{address: "127.0.0.1", port_value: 7000}`, `{address: "127.0.0.1", port_value: 7001}`}},
		{"IPv6 any becomes ::1", "listen: {extproc: \"[::]:7000\"}\n", bootstrap.Options{},
			[]string{`{address: "::1", port_value: 7000}`}},
		{"host override, DNS clusters", "listen: {extproc: \"0.0.0.0:9002\", xds: \"0.0.0.0:18000\"}\n",
			bootstrap.Options{NarwhalHosts: []string{"narwhal.internal"}, Listen: "127.0.0.1:8080", Admin: "[::1]:9000"},
			[]string{"type: STRICT_DNS", "dns_lookup_family: V4_PREFERRED", `{address: "narwhal.internal", port_value: 9002}`,
				`{address: "127.0.0.1", port_value: 8080}`, `{address: "::1", port_value: 9000}`}},
		{"full duplex has no message_timeout", "", bootstrap.Options{BodyMode: bootstrap.BodyFullDuplex},
			[]string{"request_body_mode: FULL_DUPLEX_STREAMED", "request_trailer_mode: SEND"}},
		{"custom paths, prefix, limits, long wait", `
router:
  paths: [/v1/completions, /generate]
  body_limit_bytes: 33554432
  waiting_set: {capacity: 100000, max_wait_s: 600}
xds: {cluster_prefix: llm}
`, bootstrap.Options{},
			[]string{`path: "/generate"`, "cluster: llm-engines", "message_timeout: 605s", "stream_idle_timeout: 665s",
				"per_connection_buffer_limit_bytes: 34603008", "max_requests: 101376"}},
		{"fractional wait", "router: {waiting_set: {max_wait_s: 2.5}}\n", bootstrap.Options{},
			[]string{"message_timeout: 7.5s"}},
		// Issue 11: replicas on etcd. Every replica is an endpoint of both clusters; the ext_proc
		// cluster's gRPC health check sends streams to the leader only.
		{"several replicas", "listen: {extproc: \"0.0.0.0:9002\", xds: \"0.0.0.0:18000\"}\n",
			bootstrap.Options{NarwhalHosts: []string{"narwhal-a", "narwhal-b"}},
			[]string{`{address: "narwhal-a", port_value: 9002}`, `{address: "narwhal-b", port_value: 9002}`,
				`{address: "narwhal-a", port_value: 18000}`, `{address: "narwhal-b", port_value: 18000}`,
				"grpc_health_check: {}", "standbys answer NOT_SERVING"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := load(t, c.cfg)
			out, err := bootstrap.Generate(cfg, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range c.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q", w)
				}
			}
			if c.opts.BodyMode == bootstrap.BodyFullDuplex && regexp.MustCompile(`(?m)^\s+message_timeout:`).Match(out) {
				t.Error("full duplex output sets message_timeout")
			}
			for _, p := range bootstrap.Validate(out, cfg) {
				t.Errorf("line %d: %s", p.Line, p)
			}
		})
	}
}

func TestBootstrapErrors(t *testing.T) {
	cfg := defaultConfig(t)
	if _, err := bootstrap.Generate(nil, bootstrap.Options{}); err == nil {
		t.Error("nil config: no error")
	}
	for _, o := range []bootstrap.Options{
		{BodyMode: "STREAMED"},
		{Listen: "10000"},
		{Admin: "127.0.0.1:0"},
	} {
		if _, err := bootstrap.Generate(cfg, o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	long, err := config.Load([]byte("router: {waiting_set: {max_wait_s: 4000}}\n" + twoEngines))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrap.Generate(long, bootstrap.Options{}); err == nil || !strings.Contains(err.Error(), "FULL_DUPLEX_STREAMED") {
		t.Errorf("max_wait_s beyond Envoy's message_timeout limit: err = %v", err)
	}
	if _, err := bootstrap.Generate(long, bootstrap.Options{BodyMode: bootstrap.BodyFullDuplex}); err != nil {
		t.Errorf("max_wait_s 4000 in full duplex: %v", err)
	}
}

// checkHACompose checks examples/docker-compose-ha.yaml: etcd, two replicas mounting the HA
// config (whose ha.etcd.endpoints name the etcd service), the engines of that config, and Envoy
// mounting the bootstrap generated for both replicas.
func checkHACompose(t *testing.T, data []byte) {
	t.Helper()
	var cf composeFile
	if err := yaml.Unmarshal(data, &cf); err != nil {
		t.Fatalf("docker-compose-ha.yaml: %v", err)
	}
	cfg := haComposeConfig(t)
	mounts := func(svc, src, target string) {
		if !slices.Contains(cf.Services[svc].Volumes, src+":"+target+":ro") {
			t.Errorf("docker-compose-ha.yaml: services.%s does not mount %s at %s (volumes %v)", svc, src, target, cf.Services[svc].Volumes)
		}
		if _, err := os.Stat(filepath.Join(examplesDir, src)); err != nil {
			t.Errorf("docker-compose-ha.yaml: %s does not exist", src)
		}
	}
	if _, ok := cf.Services["etcd"]; !ok || !slices.Contains(cfg.HA.Etcd.Endpoints, "http://etcd:2379") {
		t.Errorf("docker-compose-ha.yaml: no etcd service, or the config's ha.etcd.endpoints %v do not name it", cfg.HA.Etcd.Endpoints)
	}
	for _, host := range haComposeOptions.NarwhalHosts {
		mounts(host, "./narwhal-ha-compose.yaml", "/etc/narwhal/config.yaml")
	}
	mounts("envoy", "./envoy/envoy-ha-compose.yaml", "/etc/envoy/envoy.yaml")
	checkComposeTLS(t, "docker-compose-ha.yaml", cf, cfg, haComposeOptions)
	checkComposeExposure(t, "docker-compose-ha.yaml", cf, cfg)
	for _, e := range cfg.Engines {
		host := e.Address[:strings.LastIndexByte(e.Address, ':')]
		if _, ok := cf.Services[host]; !ok {
			t.Errorf("docker-compose-ha.yaml: no service %s for engine %s", host, e.ID)
		}
	}
}

// A config that discovers its engines gets circuit breakers sized for the engines discovery
// may add (DefaultDiscoveredEngines, or Options.DiscoveredEngines), each at the largest
// profile's streams; the bootstrap validates against it.
func TestDiscoveredEnginesBreakers(t *testing.T) {
	cfg, err := config.Load([]byte("discovery: {file: {path: /etc/narwhal/endpoints.yaml}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Profiles[config.DefaultProfileName]
	per := p.Decode.MaxStreams + p.PrefillConcurrency
	breaker := regexp.MustCompile(`(?s)name: narwhal-original-dst.*?max_requests: (\d+)`)
	for _, tc := range []struct{ n, want int }{{0, bootstrap.DefaultDiscoveredEngines}, {2, 2}} {
		out, err := bootstrap.Generate(cfg, bootstrap.Options{DiscoveredEngines: tc.n})
		if err != nil {
			t.Fatal(err)
		}
		m := breaker.FindSubmatch(out)
		got, _ := strconv.Atoi(string(m[1]))
		if need := tc.want * per; got < need || got >= need+1024 {
			t.Errorf("DiscoveredEngines %d: max_requests %d, want the first multiple of 1024 at or above %d", tc.n, got, need)
		}
		if ps := bootstrap.Validate(out, cfg); len(ps) > 0 {
			t.Errorf("DiscoveredEngines %d: %v", tc.n, ps)
		}
	}
}
