// Command coredns is CoreDNS with a fixed, small plugin set: it answers the cluster's own names
// (kubernetes) and nothing else. There is no forward plugin, so a pod asking for an outside
// name gets an answer from here (NXDOMAIN/SERVFAIL) instead of a query leaving the machine.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The plugins below register themselves; Directives says their order, which must follow
	// CoreDNS' own (core/dnsserver/zdirectives.go).
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"bind", "ready", "errors", "log", "cache", "kubernetes"}
}

func main() {
	coremain.Run()
}
