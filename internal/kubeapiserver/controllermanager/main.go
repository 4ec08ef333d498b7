// Command kube-controller-manager is Kubernetes' controller manager, built from the Kubernetes
// module like kube-apiserver (the module above) for the tests that roll a Deployment of Narwhal
// replicas (docs/kubernetes.md): `make kube-controller-manager` builds it once into the cache.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() { os.Exit(cli.Run(app.NewControllerManagerCommand())) }
