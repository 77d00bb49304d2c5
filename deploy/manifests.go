// Package deploy holds dbcloud's own Kubernetes manifests (Kustomize) and
// reads them as objects, for the tests that validate them against an
// apiserver and deploy them into a cluster.
package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// Manifests reads the resources dir/kustomization.yaml lists (plain files:
// the kustomization has no patches) with its namespace applied to the
// namespaced objects.
func Manifests(dir string) ([]*unstructured.Unstructured, error) {
	var k struct {
		Namespace string   `json:"namespace"`
		Resources []string `json:"resources"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	if err := sigsyaml.Unmarshal(b, &k); err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	var out []*unstructured.Unstructured
	for _, r := range k.Resources {
		b, err := os.ReadFile(filepath.Join(dir, filepath.Clean(r)))
		if err != nil {
			return nil, err
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", r, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if u.GetNamespace() != "" || u.GetKind() == "Deployment" || u.GetKind() == "Service" {
				u.SetNamespace(k.Namespace)
			}
			out = append(out, u)
		}
	}
	return out, nil
}
