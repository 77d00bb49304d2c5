package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"dbcloud"
)

// objectStoreKind is the barman-cloud plugin's ObjectStore. It is read and
// written as unstructured: the runtime copies a template's spec and
// changes one field of it, which needs none of the plugin's Go types (and
// none of their dependencies).
func objectStoreKind() schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: "barmancloud.cnpg.io", Version: "v1", Kind: "ObjectStore"}
}

// ensureObjectStore gives a project's namespace its ObjectStore, copied
// from the template (Config.ObjectStoreFrom) with the credentials Secrets
// it names. Each project archives under its own path of the template's
// destination (destinationPath/<namespace>): a server name is a cluster's
// name, unique only inside its namespace, and one project's forks never
// read another's archive. Without a template the ObjectStore is the
// operator's to make, and nothing is done.
func (rt *Runtime) ensureObjectStore(ctx context.Context, ns string) error {
	if rt.cfg.ObjectStore == "" || rt.cfg.ObjectStoreFrom == "" {
		return nil
	}
	tmpl := &unstructured.Unstructured{}
	tmpl.SetGroupVersionKind(objectStoreKind())
	if err := rt.c.Get(ctx, types.NamespacedName{Namespace: rt.cfg.ObjectStoreFrom, Name: rt.cfg.ObjectStore}, tmpl); err != nil {
		return fmt.Errorf("object store template %s/%s: %w", rt.cfg.ObjectStoreFrom, rt.cfg.ObjectStore, err)
	}
	spec, err := projectObjectStoreSpec(tmpl, ns)
	if err != nil {
		return err
	}
	for _, name := range secretRefs(spec["configuration"]) {
		if err := rt.copySecret(ctx, rt.cfg.ObjectStoreFrom, ns, name); err != nil {
			return err
		}
	}
	store := &unstructured.Unstructured{}
	store.SetGroupVersionKind(objectStoreKind())
	store.SetNamespace(ns)
	store.SetName(rt.cfg.ObjectStore)
	return rt.upsert(ctx, store, func() error {
		store.SetLabels(mergeLabels(store.GetLabels(), map[string]string{LabelManagedBy: managedBy}))
		return unstructured.SetNestedMap(store.Object, spec, "spec")
	})
}

// ownObjectStore makes the project's copy of the object store, and the
// credentials it names, dependents of cluster as well. Every Cluster of the
// project owns them, so the garbage collector removes them with the last
// one: a project without services keeps no credentials to the archive (the
// next service copies them again). Without a template they are not the
// runtime's, and nothing is done.
func (rt *Runtime) ownObjectStore(ctx context.Context, cluster *apiv1.Cluster) error {
	if rt.cfg.ObjectStore == "" || rt.cfg.ObjectStoreFrom == "" {
		return nil
	}
	store := &unstructured.Unstructured{}
	store.SetGroupVersionKind(objectStoreKind())
	store.SetNamespace(cluster.Namespace)
	store.SetName(rt.cfg.ObjectStore)
	if err := rt.own(ctx, cluster, store); err != nil {
		return fmt.Errorf("object store %s/%s: %w", cluster.Namespace, rt.cfg.ObjectStore, err)
	}
	conf, _, _ := unstructured.NestedFieldNoCopy(store.Object, "spec", "configuration")
	for _, name := range secretRefs(conf) {
		if err := rt.own(ctx, cluster, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: name}}); err != nil {
			return fmt.Errorf("object store secret %s/%s: %w", cluster.Namespace, name, err)
		}
	}
	return nil
}

// projectObjectStoreSpec is the template's spec with the project's own
// destination path.
func projectObjectStoreSpec(tmpl *unstructured.Unstructured, ns string) (map[string]any, error) {
	spec, found, err := unstructured.NestedMap(tmpl.Object, "spec")
	if err != nil || !found {
		return nil, dbcloud.Terminal(fmt.Errorf("object store template %s/%s has no spec", tmpl.GetNamespace(), tmpl.GetName()))
	}
	dest, _, _ := unstructured.NestedString(spec, "configuration", "destinationPath")
	if dest == "" {
		return nil, dbcloud.Terminal(fmt.Errorf("object store template %s/%s has no spec.configuration.destinationPath", tmpl.GetNamespace(), tmpl.GetName()))
	}
	if err := unstructured.SetNestedField(spec, strings.TrimRight(dest, "/")+"/"+ns, "configuration", "destinationPath"); err != nil {
		return nil, err
	}
	return spec, nil
}

// secretRefs lists the Secrets a barman object store configuration names:
// every credential (S3, Azure, Google) and the endpoint's CA is a
// SecretKeySelector, an object of exactly a name and a key, so a walk
// finds them all without knowing each provider's fields.
func secretRefs(v any) []string {
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			name, nameOK := v["name"].(string)
			_, keyOK := v["key"].(string)
			if nameOK && keyOK && len(v) == 2 {
				out = append(out, name)
				return
			}
			for _, k := range slices.Sorted(maps.Keys(v)) {
				walk(v[k])
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
	slices.Sort(out)
	return slices.Compact(out)
}

// copySecret writes the data of Secret name in from to a Secret of the same
// name in ns, so the plugin's sidecar in the project's pods can read it.
func (rt *Runtime) copySecret(ctx context.Context, from, ns, name string) error {
	src := &corev1.Secret{}
	if err := rt.c.Get(ctx, types.NamespacedName{Namespace: from, Name: name}, src); err != nil {
		return fmt.Errorf("object store secret %s/%s: %w", from, name, err)
	}
	dst := &corev1.Secret{}
	dst.Namespace, dst.Name = ns, name
	return rt.upsert(ctx, dst, func() error {
		dst.Labels = mergeLabels(dst.Labels, map[string]string{LabelManagedBy: managedBy})
		dst.Type = src.Type
		dst.Data = src.Data
		return nil
	})
}
