// Command kubelet is the upstream kubelet entry point
// (k8s.io/kubernetes cmd/kubelet/kubelet.go), built by e2e/controlplane/build.sh
// (ENVELOPE_CONTROLPLANE_KUBELET=1) from the same generated go.mod as kube-apiserver,
// for the e2e node (e2e/harness/node.py).
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // for client metric registration
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	command := app.NewKubeletCommand(context.Background())
	code := cli.Run(command)
	os.Exit(code)
}
