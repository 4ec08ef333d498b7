package bootstrap

import (
	"errors"
	"fmt"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/narwhal-llm/narwhal/config"
)

// ExtProcFilter returns the ext_proc filter of the bootstrap Generate writes for cfg and o, as
// Envoy reads it, and its listener's per_connection_buffer_limit_bytes (0: Envoy's default):
// what `narwhal load` plays (docs/load.md), so that it sends Narwhal what the Envoy of `narwhal
// envoy-config` would.
func ExtProcFilter(cfg *config.Config, o Options) (*extprocv3.ExternalProcessor, int, error) {
	plain := *cfg // the transport to Narwhal shapes the clusters, not the filter
	plain.TLS, o.TLS = config.TLS{}, ClientTLS{}
	data, err := Generate(&plain, o)
	if err != nil {
		return nil, 0, err
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, 0, err
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		return nil, 0, fmt.Errorf("envoy: the generated bootstrap: %w", err)
	}
	for _, ln := range b.GetStaticResources().GetListeners() {
		for _, fc := range ln.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if a := f.GetTypedConfig(); a == nil || typeName(a) != hcmFilterType || a.UnmarshalTo(&hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					if typeName(hf.GetTypedConfig()) != extProcFilterType {
						continue
					}
					var ep extprocv3.ExternalProcessor
					if err := hf.GetTypedConfig().UnmarshalTo(&ep); err != nil {
						return nil, 0, err
					}
					return &ep, int(ln.GetPerConnectionBufferLimitBytes().GetValue()), nil
				}
			}
		}
	}
	return nil, 0, errors.New("envoy: the generated bootstrap has no ext_proc filter")
}
