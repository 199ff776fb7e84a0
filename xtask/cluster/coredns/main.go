// The cluster tier's cluster DNS: CoreDNS at the version kubeadm v1.35 installs
// (cmd/kubeadm/app/constants: CoreDNSVersion), built with the plugins of kubeadm's kube-dns
// Corefile that answer for the cluster itself. Left out: forward and loop (the tier's
// clusters have no upstream resolver), prometheus, and the cloud plugins (route53, azure,
// clouddns) whose SDKs the full build links. This is how CoreDNS documents a build with a
// chosen plugin set: coremain with dnsserver.Directives in plugin.cfg's order.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// directives: the plugins above, in the order of CoreDNS's plugin.cfg, which is the order a
// query passes them.
var directives = []string{
	"reload",
	"ready",
	"health",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
