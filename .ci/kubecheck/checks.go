package main

import (
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
)

// The relay's secrets: never as plain environment variables, always as files (their _FILE).
var secretSettings = []string{"DATABASE_URL", "FGA_API_TOKEN", "FGA_CLIENT_SECRET"}

// The default of --request-timeout (docs/configuration.md).
const defaultRequestTimeout = 10 * time.Second

// podTemplate is a workload's pod template, and where it was declared.
type podTemplate struct {
	where string
	spec  corev1.PodSpec
}

// checkObjects checks what strict decoding cannot: see the package comment.
func checkObjects(objects []object, settings, commands map[string]bool, p *problems) {
	configMaps := map[string]*corev1.ConfigMap{}
	var pods []podTemplate
	var deployments []object
	for _, o := range objects {
		switch v := o.value.(type) {
		case *corev1.ConfigMap:
			configMaps[v.Name] = v
		case *appsv1.Deployment:
			pods = append(pods, podTemplate{o.where, v.Spec.Template.Spec})
			deployments = append(deployments, o)
		case *batchv1.Job:
			pods = append(pods, podTemplate{o.where, v.Spec.Template.Spec})
		case *batchv1.CronJob:
			pods = append(pods, podTemplate{o.where, v.Spec.JobTemplate.Spec.Template.Spec})
		}
	}
	for name, cm := range configMaps {
		for _, key := range sortedKeys(cm.Data) {
			if !settings[key] {
				p.add("ConfigMap "+name, "%s is no setting of fga-relay", key)
			}
			for _, secret := range secretSettings {
				if key == secret {
					p.add("ConfigMap "+name, "%s is a secret: give it as a file (%s_FILE)", key, key)
				}
			}
		}
	}
	for _, pod := range pods {
		checkPod(pod, settings, commands, p)
	}
	if len(deployments) == 0 {
		p.add("deploy/kubernetes", "no Deployment")
	}
	for _, d := range deployments {
		checkDeployment(d, configMaps, p)
	}
	for _, o := range objects {
		switch v := o.value.(type) {
		case *policyv1.PodDisruptionBudget:
			if !selectsAny(v.Spec.Selector, deployments) {
				p.add(o.where, "the PodDisruptionBudget selects no Deployment's pods")
			}
		case *monitoringv1.PodMonitor:
			checkPodMonitor(o.where, v, deployments, p)
		}
	}
}

// checkPod: hardened, secrets as files, the relay's own commands and settings, resources asked.
func checkPod(pod podTemplate, settings, commands map[string]bool, p *problems) {
	spec, where := pod.spec, pod.where
	sc := spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		p.add(where, "the pod does not set securityContext.runAsNonRoot: true")
	}
	if sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.add(where, "the pod does not set securityContext.seccompProfile.type: RuntimeDefault")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		p.add(where, "the pod mounts a service account token it has no use for")
	}
	secretVolumes := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			secretVolumes[v.Name] = true
		}
	}
	containers := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	for _, c := range containers {
		at := where + " container " + c.Name
		csc := c.SecurityContext
		if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
			p.add(at, "does not set allowPrivilegeEscalation: false")
		}
		if csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
			p.add(at, "does not set readOnlyRootFilesystem: true")
		}
		if csc == nil || csc.Capabilities == nil || !dropsAll(csc.Capabilities.Drop) {
			p.add(at, "does not drop ALL capabilities")
		}
		if csc != nil && csc.Privileged != nil && *csc.Privileged {
			p.add(at, "is privileged")
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
			p.add(at, "does not request cpu and memory")
		}
		if len(c.Command) > 0 {
			p.add(at, "replaces the image's entrypoint (fga-relay); give the command in args")
		}
		if len(c.Args) == 0 || !commands[c.Args[0]] {
			p.add(at, "args %q do not start with a command of fga-relay (%s)", c.Args, strings.Join(sortedKeys(commands), ", "))
		}
		for _, from := range c.EnvFrom {
			if from.SecretRef != nil {
				p.add(at, "takes environment variables from Secret %s: mount it as files", from.SecretRef.Name)
			}
		}
		mounts := map[string]string{} // mount path -> volume, for the secret volumes
		for _, m := range c.VolumeMounts {
			if secretVolumes[m.Name] {
				mounts[strings.TrimSuffix(m.MountPath, "/")] = m.Name
				if !m.ReadOnly {
					p.add(at, "mounts secret volume %s writable", m.Name)
				}
				if m.SubPath != "" {
					p.add(at, "mounts secret volume %s with subPath, which a rotated Secret never reaches", m.Name)
				}
			}
		}
		for _, e := range c.Env {
			if !settings[e.Name] {
				p.add(at, "%s is no setting of fga-relay", e.Name)
			}
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				p.add(at, "%s comes from a Secret as an environment variable: mount it as a file", e.Name)
			}
			for _, secret := range secretSettings {
				if e.Name == secret {
					p.add(at, "%s is a secret: give it as a file (%s_FILE)", e.Name, secret)
				}
				if e.Name == secret+"_FILE" {
					dir := e.Value[:max(strings.LastIndex(e.Value, "/"), 0)]
					if _, ok := mounts[dir]; !ok {
						p.add(at, "%s=%s is not in a mounted Secret", e.Name, e.Value)
					}
				}
			}
		}
	}
}

// checkDeployment: replicas for a standby, the probes, and a grace period the relay can stop in.
func checkDeployment(o object, configMaps map[string]*corev1.ConfigMap, p *problems) {
	d := o.value.(*appsv1.Deployment)
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		p.add(o.where, "fewer than two replicas: no standby takes over")
	}
	spec := d.Spec.Template.Spec
	for _, c := range spec.Containers {
		at := o.where + " container " + c.Name
		ports := map[string]bool{}
		for _, port := range c.Ports {
			ports[port.Name] = true
		}
		probe := func(kind string, pr *corev1.Probe, path string) {
			switch {
			case pr == nil || pr.HTTPGet == nil:
				p.add(at, "has no HTTP %s probe", kind)
			case pr.HTTPGet.Path != path:
				p.add(at, "%s probe is on %s, not %s", kind, pr.HTTPGet.Path, path)
			case pr.HTTPGet.Port.StrVal == "" || !ports[pr.HTTPGet.Port.StrVal]:
				p.add(at, "%s probe is on port %s, which the container does not name", kind, pr.HTTPGet.Port.String())
			}
		}
		probe("liveness", c.LivenessProbe, "/livez")
		probe("readiness", c.ReadinessProbe, "/readyz")

		timeout := defaultRequestTimeout
		for _, from := range c.EnvFrom {
			if from.ConfigMapRef == nil {
				continue
			}
			if cm, ok := configMaps[from.ConfigMapRef.Name]; !ok {
				p.add(at, "takes its settings from ConfigMap %s, which no manifest declares", from.ConfigMapRef.Name)
			} else if v, ok := cm.Data["FGA_RELAY_REQUEST_TIMEOUT"]; ok {
				parsed, err := time.ParseDuration(v)
				if err != nil {
					p.add(at, "FGA_RELAY_REQUEST_TIMEOUT=%s: this check reads Go durations only", v)
					continue
				}
				timeout = parsed
			}
		}
		grace := time.Duration(corev1.DefaultTerminationGracePeriodSeconds) * time.Second
		if spec.TerminationGracePeriodSeconds != nil {
			grace = time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
		}
		if grace <= timeout {
			p.add(at, "terminationGracePeriodSeconds (%s) is not above the request timeout (%s): a stopping relay is killed with Writes in flight", grace, timeout)
		}
	}
}

// checkPodMonitor: it scrapes the Deployment's pods, on a port they name, under job="fga-relay".
func checkPodMonitor(where string, m *monitoringv1.PodMonitor, deployments []object, p *problems) {
	if !selectsAny(&m.Spec.Selector, deployments) {
		p.add(where, "the PodMonitor selects no Deployment's pods")
		return
	}
	for _, d := range deployments {
		tmpl := d.value.(*appsv1.Deployment).Spec.Template
		if job := tmpl.Labels[m.Spec.JobLabel]; m.Spec.JobLabel == "" || job != "fga-relay" {
			p.add(where, "jobLabel %q gives the job %q, not the fga-relay the alerting rules expect", m.Spec.JobLabel, job)
		}
		ports := map[string]bool{}
		for _, c := range tmpl.Spec.Containers {
			for _, port := range c.Ports {
				ports[port.Name] = true
			}
		}
		for _, e := range m.Spec.PodMetricsEndpoints {
			if e.Port == nil || !ports[*e.Port] {
				p.add(where, "an endpoint's port is not one the pods name")
			}
			if e.Path != "" && e.Path != "/metrics" {
				p.add(where, "an endpoint scrapes %s, not /metrics", e.Path)
			}
		}
	}
	if len(m.Spec.PodMetricsEndpoints) == 0 {
		p.add(where, "the PodMonitor has no endpoint")
	}
}

// selectsAny: the selector matches the pod template of one of the Deployments.
func selectsAny(sel *metav1.LabelSelector, deployments []object) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return false
	}
	for _, d := range deployments {
		if s.Matches(labels.Set(d.value.(*appsv1.Deployment).Spec.Template.Labels)) {
			return true
		}
	}
	return false
}

func dropsAll(caps []corev1.Capability) bool {
	for _, c := range caps {
		if c == "ALL" {
			return true
		}
	}
	return false
}
