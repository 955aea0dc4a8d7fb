// Command kube-scheduler is the upstream kube-scheduler entry point
// (k8s.io/kubernetes cmd/kube-scheduler/scheduler.go), built by
// e2e/controlplane/build.sh from the same generated go.mod as kube-apiserver.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version" // for version metric registration
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	command := app.NewSchedulerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
