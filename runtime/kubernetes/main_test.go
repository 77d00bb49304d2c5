package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud"
	"dbcloud/internal/kubetest"
	"dbcloud/runtime/kubernetes"
)

// apiserver is the kube-apiserver every test of the package shares: it
// takes seconds to start and install CNPG's CRDs. Tests isolate themselves
// by project (namespace).
type apiserver struct {
	env     *kubetest.Env
	client  client.Client
	skipped string
}

var shared apiserver

func TestMain(m *testing.M) {
	env, err := kubetest.Start(filepath.Join("testdata", "crds"))
	var noAssets *kubetest.ErrNoAssets
	switch {
	case errors.As(err, &noAssets) && os.Getenv(kubetest.RequireEnv) != "1":
		shared.skipped = err.Error()
	case err != nil:
		fmt.Fprintln(os.Stderr, "kubetest:", err)
		os.Exit(1)
	default:
		shared.env = env
		scheme, serr := kubernetes.Scheme()
		if serr == nil {
			shared.client, serr = client.New(env.Config, client.Options{Scheme: scheme})
		}
		if serr != nil {
			env.Stop()
			fmt.Fprintln(os.Stderr, "kubetest:", serr)
			os.Exit(1)
		}
	}
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "kubetest: stop:", err)
		}
	}
	os.Exit(code)
}

// newRuntime returns a runtime on the shared apiserver, or skips the test
// when the apiserver's binaries are not built (never in CI: scripts/test.sh
// builds them and sets kubetest.RequireEnv).
func newRuntime(t *testing.T, cfg kubernetes.Config) *kubernetes.Runtime {
	t.Helper()
	if shared.client == nil {
		t.Skip(shared.skipped)
	}
	cfg.Client = shared.client
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	rt, err := kubernetes.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newService is a service of a project of its own (a namespace per test).
func newService(spec dbcloud.ServiceSpec) *dbcloud.Service {
	return &dbcloud.Service{
		ID: dbcloud.NewID(), ProjectID: dbcloud.NewID(), Name: "svc", Spec: spec, Generation: 1,
		PasswordVerifier: dbcloud.NewSCRAMVerifier("first-password"),
	}
}
