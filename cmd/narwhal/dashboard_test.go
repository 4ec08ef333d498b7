package main

import (
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"
)

// Issue 13: every metric the Grafana dashboard (examples/grafana/narwhal.json) queries is in a
// running narwhal serve's /metrics — from the start, before any request or move — and every
// panel reads the datasource the compose example provisions.
func TestDashboardMetricsExist(t *testing.T) {
	b, err := os.ReadFile("../../examples/grafana/narwhal.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr       string `json:"expr"`
				Datasource struct {
					UID string `json:"uid"`
				} `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	dsb, err := os.ReadFile("../../examples/grafana/provisioning/datasources/prometheus.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds struct {
		Datasources []struct {
			UID string `json:"uid"`
		} `json:"datasources"`
	}
	if err := yaml.Unmarshal(dsb, &ds); err != nil || len(ds.Datasources) != 1 {
		t.Fatalf("the datasource: %v", err)
	}

	adminAddr := serveActive(t, "prefill", "decode")
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	metric := regexp.MustCompile(`\bnarwhal_[a-z_]+`)
	queried := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Datasource.UID != ds.Datasources[0].UID {
				t.Errorf("panel %q reads datasource %q, the example provisions %q", p.Title, tg.Datasource.UID, ds.Datasources[0].UID)
			}
			for _, name := range metric.FindAllString(tg.Expr, -1) {
				queried++
				family := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if f, ok := strings.CutSuffix(name, suffix); ok && fams[f] != nil && fams[f].GetType().String() == "HISTOGRAM" {
						family = f
					}
				}
				if fams[family] == nil {
					t.Errorf("panel %q queries %s, which /metrics does not have", p.Title, name)
				}
			}
		}
	}
	var names []string
	for n := range fams {
		names = append(names, n)
	}
	slices.Sort(names)
	if queried < 20 {
		t.Fatalf("the dashboard queries %d metrics; /metrics has %v", queried, names)
	}
}
