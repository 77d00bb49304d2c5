// Package kubetest starts a real kube-apiserver and etcd for tests, with
// CloudNativePG's CRDs from the pinned module installed: controller-runtime's
// envtest, pointed at the binaries scripts/kube-test-assets.sh builds from
// the Go module proxy (the single-node cluster's own kube-apiserver and
// etcd, scripts/kube-build.sh kube-node). There is no kubelet and no controller:
// objects are stored and validated, pods never run, and tests write the
// statuses an operator would.
package kubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// RequireEnv, set to 1, makes missing assets a failure instead of a skip;
// scripts/test.sh sets it after building them, so CI never skips.
const RequireEnv = "DBCLOUD_REQUIRE_KUBE"

// CNPGModule is the module whose config/crd/bases are installed; its
// version is the one go.mod pins for the API types.
const CNPGModule = "github.com/cloudnative-pg/cloudnative-pg"

// Env is a running apiserver.
type Env struct {
	Config *rest.Config
	env    *envtest.Environment
}

// Stop stops the apiserver and etcd.
func (e *Env) Stop() error { return e.env.Stop() }

// ErrNoAssets says the binaries are not built; the message says how.
type ErrNoAssets struct{ Script string }

func (e *ErrNoAssets) Error() string {
	return fmt.Sprintf("kube-apiserver and etcd are not built: run %s (several minutes, once)", e.Script)
}

// Start starts kube-apiserver and etcd from KUBEBUILDER_ASSETS, else from
// the cache of scripts/kube-test-assets.sh, and installs CNPG's CRDs plus
// the files of extraCRDDirs. It returns *ErrNoAssets when neither has them.
func Start(extraCRDDirs ...string) (*Env, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		script := filepath.Join(root, "scripts", "kube-test-assets.sh")
		out, err := exec.Command(script, "-n").Output()
		if err != nil {
			return nil, &ErrNoAssets{Script: script}
		}
		assets = strings.TrimSpace(string(out))
	}
	crds, err := moduleDir(root, CNPGModule)
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     append([]string{filepath.Join(crds, "config", "crd", "bases")}, extraCRDDirs...),
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start kube-apiserver and etcd from %s: %w", assets, err)
	}
	return &Env{Config: cfg, env: env}, nil
}

// moduleRoot is the directory of dbcloud's go.mod, above the test's directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module dbcloud\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no dbcloud go.mod above the working directory")
		}
		dir = parent
	}
}

// moduleDir is where the Go module cache holds the version of module that
// go.mod requires (downloaded from the module proxy when missing).
func moduleDir(root, module string) (string, error) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(gobin, "mod", "download", "-json", module)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", module, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %v %s", module, err, m.Error)
	}
	return m.Dir, nil
}

// Healthy sets a Cluster's status as CNPG's operator writes it for a
// healthy cluster of n instances named NAME-1..NAME-n (phase texts from
// api/v1's cluster_types.go), with primary as current and target primary.
func Healthy(c *apiv1.Cluster, primary string, n int) {
	var pods []string
	for i := 1; i <= n; i++ {
		pods = append(pods, fmt.Sprintf("%s-%d", c.Name, i))
	}
	c.Status.Phase = apiv1.PhaseHealthy
	c.Status.Instances, c.Status.ReadyInstances = n, n
	c.Status.InstancesStatus = map[apiv1.PodStatus][]string{apiv1.PodHealthy: pods}
	c.Status.CurrentPrimary, c.Status.TargetPrimary = primary, primary
	c.Status.Conditions = []metav1.Condition{{Type: string(apiv1.ConditionClusterReady), Status: metav1.ConditionTrue,
		Reason: "ClusterIsReady", Message: "Cluster is Ready", LastTransitionTime: metav1.Now()}}
}

// WriteStatus updates obj's status subresource with set, as a controller
// does, retrying on conflicts with whoever else writes obj.
func WriteStatus[T client.Object](ctx context.Context, c client.Client, obj T, set func(T)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		set(obj)
		return c.Status().Update(ctx, obj)
	})
}

// WriteKubeconfig writes a kubeconfig file for a cluster administrator of
// the apiserver (system:masters), for a process such as `dbcloud serve
// --runtime kubernetes --kubeconfig FILE`.
func (e *Env) WriteKubeconfig(path string) error {
	u, err := e.env.AddUser(envtest.User{Name: "dbcloud-e2e", Groups: []string{"system:masters"}}, e.Config)
	if err != nil {
		return err
	}
	b, err := u.KubeConfig()
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// StartT starts an apiserver for one test, stopped when it ends, with a
// client that knows scheme. It skips the test when the binaries are not
// built, unless RequireEnv is set (CI), where that fails it.
func StartT(t testing.TB, scheme *kruntime.Scheme, extraCRDDirs ...string) (*Env, client.Client) {
	t.Helper()
	env, err := Start(extraCRDDirs...)
	var noAssets *ErrNoAssets
	if errors.As(err, &noAssets) && os.Getenv(RequireEnv) != "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop kube-apiserver: %v", err)
		}
	})
	c, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return env, c
}
