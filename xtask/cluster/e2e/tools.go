//go:build tools

// The cluster tier's network conformance run: Kubernetes' e2e suite (`go test -c` of
// test/e2e, which links every suite) and agnhost, the image its networking tests run,
// both at the version the tier's control plane is built at (../kubernetes).
package tools

import (
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
