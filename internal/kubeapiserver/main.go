// Command kube-apiserver is Kubernetes' API server, built from the Kubernetes module through the
// Go module proxy for the tests of Narwhal's Kubernetes discovery and leader election
// (docs/kubernetes.md): `make kube-apiserver` builds it once into the cache the tests read.
// It is its own module, so that Narwhal's go.mod does not carry Kubernetes' dependencies.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
