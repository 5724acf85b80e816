package main

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodMonitor is the Prometheus Operator's monitoring.coreos.com/v1 PodMonitor, in the fields of
// its CustomResourceDefinition that deploy/kubernetes/podmonitor.yaml may use (names and types
// as in github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1). Decoded
// strictly, a field outside this subset is refused: add it here, from the operator's API
// reference, when a manifest needs it.
type PodMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              PodMonitorSpec `json:"spec"`
}

type PodMonitorSpec struct {
	JobLabel            string                `json:"jobLabel,omitempty"`
	PodTargetLabels     []string              `json:"podTargetLabels,omitempty"`
	PodMetricsEndpoints []PodMetricsEndpoint  `json:"podMetricsEndpoints"`
	Selector            metav1.LabelSelector  `json:"selector"`
	NamespaceSelector   *NamespaceSelector    `json:"namespaceSelector,omitempty"`
	SampleLimit         *uint64               `json:"sampleLimit,omitempty"`
	ScrapeProtocols     []string              `json:"scrapeProtocols,omitempty"`
}

type NamespaceSelector struct {
	Any        bool     `json:"any,omitempty"`
	MatchNames []string `json:"matchNames,omitempty"`
}

type PodMetricsEndpoint struct {
	Port            *string       `json:"port,omitempty"`
	PortNumber      *int32        `json:"portNumber,omitempty"`
	Path            string        `json:"path,omitempty"`
	Scheme          string        `json:"scheme,omitempty"`
	Params          map[string][]string `json:"params,omitempty"`
	Interval        string        `json:"interval,omitempty"`
	ScrapeTimeout   string        `json:"scrapeTimeout,omitempty"`
	HonorLabels     bool          `json:"honorLabels,omitempty"`
	HonorTimestamps *bool         `json:"honorTimestamps,omitempty"`
	RelabelConfigs       []RelabelConfig `json:"relabelings,omitempty"`
	MetricRelabelConfigs []RelabelConfig `json:"metricRelabelings,omitempty"`
}

type RelabelConfig struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}
