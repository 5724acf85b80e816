// The check of deploy/kubernetes/ (run by .ci/check-deploy): every manifest decoded strictly into
// the Kubernetes API's own types, as the API server's strict field validation would.
module fga-relay/ci/kubecheck

go 1.25.0

require (
	k8s.io/api v0.35.0
	k8s.io/apimachinery v0.35.0
	sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730
	sigs.k8s.io/yaml v1.6.0
)
