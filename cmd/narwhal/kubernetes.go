package main

import (
	"fmt"
	"log/slog"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/discovery"
	"github.com/narwhal-llm/narwhal/fleet"
)

// newKubernetes builds the Kubernetes discovery of cfg: its client from
// discovery.kubernetes.kubeconfig, or in-cluster from the pod's service account.
func newKubernetes(cfg *config.Config, f *fleet.Fleet, log *slog.Logger) (*discovery.Kubernetes, error) {
	kc := cfg.Discovery.Kubernetes
	rc, err := kubeClientConfig("discovery.kubernetes", kc.Kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "narwhal/" + version
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("discovery.kubernetes: %w", err)
	}
	// The /version checks' client has its own rate limit (discovery.Kubernetes.Server); the
	// dynamic client's settings serve it (JSON, no types to know).
	server, err := rest.UnversionedRESTClientFor(dynamic.ConfigFor(rc))
	if err != nil {
		return nil, fmt.Errorf("discovery.kubernetes: %w", err)
	}
	return &discovery.Kubernetes{Config: kc, Client: dyn, Server: server, Source: discovery.NewSource(discovery.SourceKubernetes, cfg),
		Fleet: f, RoleLabel: cfg.Discovery.RoleLabel, Now: time.Now, Log: log}, nil
}

// kubeClientConfig reads a kubeconfig file, or, with none, the in-cluster config; key is the
// config section that asks (discovery.kubernetes, ha.kubernetes), named in errors.
func kubeClientConfig(key, path string) (*rest.Config, error) {
	if path == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("not in a cluster (%w): set %s.kubeconfig", err, key)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("%s.kubeconfig %s: %w", key, path, err)
	}
	return rc, nil
}
