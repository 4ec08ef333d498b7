package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"

	"k8s.io/client-go/dynamic"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/ha"
	"github.com/narwhal-llm/narwhal/tlsfiles"
)

// dialReplica joins the replicas of cfg as replica id: on the Kubernetes API server
// (ha.kubernetes) or on etcd.
func dialReplica(cfg *config.Config, id string, log *slog.Logger) (*ha.Replica, error) {
	if k := cfg.HA.Kubernetes; k.Namespace != "" {
		rc, err := kubeClientConfig("ha.kubernetes", k.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("ha.kubernetes: %w", err)
		}
		rc.UserAgent = "narwhal/" + version
		leases, err := dynamic.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("ha.kubernetes: %w", err)
		}
		state, err := dynamic.NewForConfig(rc) // its own rate limit (ha.LeaseOptions)
		if err != nil {
			return nil, fmt.Errorf("ha.kubernetes: %w", err)
		}
		node := ha.NewLeaseNode(ha.LeaseOptions{Leases: leases, State: state, Namespace: k.Namespace, Name: k.Name, LeaseTTLS: cfg.HA.LeaseTTLS, ID: id, Logger: log})
		return ha.NewReplica(node, id, "configmap "+k.Namespace+"/"+k.Name+"-state", "the API server", log), nil
	}
	n, err := dialEtcd(cfg, id, log)
	if err != nil {
		return nil, err
	}
	return ha.NewReplica(n, id, "etcd "+cfg.HA.Etcd.Prefix+"/state", "etcd", log), nil
}

// dialEtcd connects to etcd as replica id.
func dialEtcd(cfg *config.Config, id string, log *slog.Logger) (*ha.Node, error) {
	tc, err := etcdTLS(cfg.HA.Etcd.TLS)
	if err != nil {
		return nil, err
	}
	// The session lives as long as the process (resign closes it), not as long as serve's
	// context: a SIGTERM must not end the lease before the drain is done and the leadership
	// handed over.
	return ha.Dial(context.Background(), ha.Options{Endpoints: cfg.HA.Etcd.Endpoints, Prefix: cfg.HA.Etcd.Prefix,
		LeaseTTLS: cfg.HA.LeaseTTLS, TLS: tc, ID: id, Logger: log})
}

func etcdTLS(t config.EtcdTLS) (*tls.Config, error) {
	if t == (config.EtcdTLS{}) {
		return nil, nil
	}
	return tlsfiles.Client("ha.etcd.tls", t.CAFile, t.CertFile, t.KeyFile)
}
