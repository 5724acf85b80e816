package main

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Kustomization is the part of kustomize's Kustomization the directory uses; decoded strictly,
// so that a field this check does not know is named rather than passed over.
type Kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// checkKustomization: the file decodes, and its resources are exactly the manifests there.
func checkKustomization(file, root string, manifests []string, p *problems) {
	where := relative(root, file)
	data, err := os.ReadFile(file)
	if err != nil {
		p.add(where, "%v", err)
		return
	}
	var k Kustomization
	if err := strictInto(data, &k); err != nil {
		p.add(where, "%v", err)
		return
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		p.add(where, "apiVersion/kind is %s/%s, not kustomize.config.k8s.io/v1beta1/Kustomization", k.APIVersion, k.Kind)
	}
	listed := map[string]bool{}
	for _, r := range k.Resources {
		if listed[r] {
			p.add(where, "resource %s is listed twice", r)
		}
		listed[r] = true
		if _, err := os.Stat(filepath.Join(filepath.Dir(file), r)); err != nil {
			p.add(where, "resource %s does not exist", r)
		}
	}
	var unlisted []string
	for _, m := range manifests {
		if !listed[m] {
			unlisted = append(unlisted, m)
		}
	}
	sort.Strings(unlisted)
	if len(unlisted) > 0 {
		p.add(where, "does not list %s", strings.Join(unlisted, ", "))
	}
}
