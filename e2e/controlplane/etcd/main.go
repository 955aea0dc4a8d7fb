// Command etcd is the upstream etcd server entry point
// (go.etcd.io/etcd/server/v3 main.go), built by e2e/controlplane/build.sh.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
