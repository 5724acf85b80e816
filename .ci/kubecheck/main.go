// Command kubecheck checks the Kubernetes manifests of deploy/kubernetes/ without a cluster.
//
// Every document of every manifest is decoded strictly into the Kubernetes API's own Go types
// (k8s.io/api; the PodMonitor into the Prometheus Operator's): an unknown or misspelled field, a
// field of the wrong case or type, a duplicated key or a malformed quantity fails, as the API
// server's strict field validation would refuse it.
// kustomization.yaml must list every manifest. Then what a schema cannot see: the hardening of
// every pod, secrets given as files, the relay's settings and commands known to the binary, the
// probes, the grace period, and the selectors of the PodDisruptionBudget and the PodMonitor.
//
//	go run . REPOSITORY_ROOT
//
// Exit status 1, one line per problem, when anything is off.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The kinds the manifests may hold, by apiVersion and kind, each with the type it decodes into.
var kinds = map[string]func() any{
	"v1/Namespace":                        func() any { return &corev1.Namespace{} },
	"v1/ConfigMap":                        func() any { return &corev1.ConfigMap{} },
	"v1/ServiceAccount":                   func() any { return &corev1.ServiceAccount{} },
	"v1/Secret":                           func() any { return &corev1.Secret{} },
	"v1/Service":                          func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                  func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                        func() any { return &batchv1.Job{} },
	"batch/v1/CronJob":                    func() any { return &batchv1.CronJob{} },
	"policy/v1/PodDisruptionBudget":       func() any { return &policyv1.PodDisruptionBudget{} },
	"monitoring.coreos.com/v1/PodMonitor": func() any { return &monitoringv1.PodMonitor{} },
}

// object is one decoded document, and where it came from.
type object struct {
	where string // file:document
	value any
}

// problems collects what is wrong, one line each.
type problems []string

func (p *problems) add(where, format string, args ...any) {
	*p = append(*p, where+": "+fmt.Sprintf(format, args...))
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kubecheck REPOSITORY_ROOT")
		os.Exit(2)
	}
	root := os.Args[1]
	dir := filepath.Join(root, "deploy", "kubernetes")
	var p problems

	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		fmt.Fprintf(os.Stderr, "kubecheck: no manifest in %s\n", dir)
		os.Exit(1)
	}
	var objects []object
	var manifests []string
	undecoded := false
	for _, file := range files {
		name := filepath.Base(file)
		if name == "kustomization.yaml" {
			continue
		}
		manifests = append(manifests, name)
		objs, err := decodeFile(file)
		if err != nil {
			p.add(relative(root, file), "%v", err)
			undecoded = true
		}
		objects = append(objects, objs...)
	}
	checkKustomization(filepath.Join(dir, "kustomization.yaml"), root, manifests, &p)

	settings, err := relaySettings(filepath.Join(root, "src"))
	if err != nil {
		p.add("src", "%v", err)
	}
	commands, err := relayCommands(filepath.Join(root, "src", "cli.rs"))
	if err != nil {
		p.add("src/cli.rs", "%v", err)
	}
	for i := range objects {
		objects[i].where = relative(root, objects[i].where)
	}
	// What the manifests say together is judged once every document decodes.
	if !undecoded {
		checkObjects(objects, settings, commands, &p)
	}

	if len(p) > 0 {
		for _, line := range p {
			fmt.Fprintln(os.Stderr, "  "+line)
		}
		os.Exit(1)
	}
	fmt.Printf("kubecheck: %d documents in %d manifests decode strictly and hold together\n",
		len(objects), len(manifests))
}

// decodeFile decodes every document of a manifest strictly into its kind's type.
func decodeFile(file string) ([]object, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var objects []object
	var errs []error
	for n := 1; ; n++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return objects, fmt.Errorf("document %d: %w", n, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		value, err := decodeStrict(doc)
		if err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", n, err))
			continue
		}
		objects = append(objects, object{where: fmt.Sprintf("%s:%d", file, n), value: value})
	}
	return objects, errors.Join(errs...)
}

// decodeStrict decodes one document into the type of its apiVersion and kind.
func decodeStrict(doc []byte) (any, error) {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return nil, err
	}
	newValue, ok := kinds[meta.APIVersion+"/"+meta.Kind]
	if !ok {
		return nil, fmt.Errorf("apiVersion %q kind %q is not one this check knows", meta.APIVersion, meta.Kind)
	}
	value := newValue()
	if err := strictInto(doc, value); err != nil {
		return nil, fmt.Errorf("%s: %w", meta.Kind, err)
	}
	return value, nil
}

// strictInto decodes YAML into v as the API server's strict field validation does: a duplicated
// key, a field v does not have, or one of another case (which encoding/json would take) is an
// error, every one of them named.
func strictInto(doc []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, v)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	return nil
}

// stripComments drops the comment lines of a document, to tell an empty one.
func stripComments(doc []byte) []byte {
	var out bytes.Buffer
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out.Write(line)
			out.WriteByte('\n')
		}
	}
	return out.Bytes()
}

func relative(root, path string) string {
	if rel, err := filepath.Rel(root, path); err == nil {
		return rel
	}
	return path
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
