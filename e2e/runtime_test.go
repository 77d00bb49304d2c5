package e2e

import (
	"context"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The suite runs on the local runtime unless told otherwise:
//
//	go test ./e2e/ -run 'TestRuntime_|TestTigerCLILogin' -args \
//	    -e2e.runtime=kubernetes -e2e.kubeconfig=$HOME/.kube/config \
//	    -e2e.kube-args='--kube-expose loadbalancer'
//
// (docs/kubernetes.md). Every server a test starts then runs `dbcloud serve
// --runtime kubernetes --kubeconfig FILE`, tests connect to the endpoints
// the API reports, and tests that need the local runtime skip themselves
// through localOnly, saying why.
var (
	e2eRuntime    = flag.String("e2e.runtime", "local", "runtime of the servers the tests start: local or kubernetes")
	e2eKubeconfig = flag.String("e2e.kubeconfig", "", "kubeconfig of the cluster for -e2e.runtime=kubernetes (CloudNativePG installed)")
	e2eKubeArgs   = flag.String("e2e.kube-args", "", "more serve flags for -e2e.runtime=kubernetes, space-separated (--kube-expose, --kube-image, --kube-storage-class ...)")
)

// onKubernetes reports whether this run's servers use the kubernetes runtime.
func onKubernetes() bool { return *e2eRuntime == "kubernetes" }

// kubernetesTests are the tests that run with -e2e.runtime=kubernetes:
// they use only the API and connections to the endpoints it reports.
var kubernetesTests = map[string]bool{
	"TestRuntime_ServiceLifecycle": true,
	"TestRuntime_Resize":           true,
	"TestRuntime_LogsAndMetrics":   true,
	"TestRuntime_HAFailover":       true,
	"TestRuntime_Pooler":           true,
	"TestRuntime_ReplicaSet":       true,
	"TestRuntime_TenantConfined":   true,
	"TestRuntime_PGVersions":       true,
	"TestRuntime_Forks":            true,
	"TestTigerCLILogin":            true,
	"TestReadme_TigerCLI":          true,
	// Deploys dbcloud itself by deploy/ into the cluster.
	"TestDeploy_TwoReplicas": true,
	// Starts its own kube-apiserver, whatever the run's runtime.
	"TestRuntime_KubernetesControlPlane": true,
}

// localReasons says, per test, what it needs of the local runtime.
var localReasons = map[string]string{
	"TestAutoPause_WakeOnConnect":                   "the Kubernetes runtime has no wake on connect (no dbcloud.Waker)",
	"TestAutoPause_WakeRefusedWhenFull":             "the Kubernetes runtime has no wake on connect (no dbcloud.Waker)",
	"TestAutoPause_WakeBurst":                       "the Kubernetes runtime has no wake on connect (no dbcloud.Waker)",
	"TestAutoPause_WakeDiskFull":                    "fills a disk image mounted on this host",
	"TestAdmin_ServicesAndTeardown":                 "checks ports and instances on this host",
	"TestUpgrade_BlueGreen":                         "the Kubernetes runtime has no blue/green upgrade (no dbcloud.BlueGreenUpgrader)",
	"TestUpgrade_BlueGreenKilledMidway":             "the Kubernetes runtime has no blue/green upgrade (no dbcloud.BlueGreenUpgrader)",
	"TestUpgrade_InPlace":                           "the Kubernetes runtime has no in-place upgrade (no dbcloud.Upgrader)",
	"TestUpgrade_KilledMidway":                      "the Kubernetes runtime has no in-place upgrade (no dbcloud.Upgrader)",
	"TestUpgrade_RehearsalFails":                    "the Kubernetes runtime has no in-place upgrade (no dbcloud.Upgrader)",
	"TestBrowserConsole":                            "drives the console against services on loopback endpoints",
	"TestBrowserPeople":                             "drives the console in Chromium on this host",
	"TestChaos":                                     "kills postmasters and corrupts files on this host",
	"TestChaos_DiskFull":                            "fills a disk image mounted on this host",
	"TestChaos_Long":                                "fills a disk image mounted on this host and kills host processes under two control planes",
	"TestCredentials":                               "the Kubernetes runtime makes no database credentials yet (no dbcloud.Credentials)",
	"TestShared_DefaultHostHoldsTwoHundred":         "counts instances and reads their cgroups on this host",
	"TestChaos_Quota":                               "runs on a btrfs image mounted on this host and kills postmasters",
	"TestStorageLimit_ReplicaSet":                   "reads quota volumes on this host",
	"TestChaos_TwoPlanes":                           "kills host processes under two control planes",
	"TestCrash_DuringCreate":                        "reads postmasters from this host's process table",
	"TestCrash_DuringResize":                        "reads postmasters from this host's process table",
	"TestCrash_Postmaster":                          "kills a postmaster on this host",
	"TestCrash_AcknowledgedWritesSurvive":           "kills dbcloud on this host mid-burst",
	"TestRestart_AdoptsPostmasters":                 "checks that host postmasters are adopted",
	"TestDiskFull":                                  "fills a disk image mounted on this host",
	"TestTimescaleDB":                               "reads instances' files on this host",
	"TestPGVersions":                                "needs PostgreSQL 17 on this host (no CloudNativePG image for 17 is built yet)",
	"TestAddonTypes":                                "needs the host's extension builds",
	"TestPgvector":                                  "needs the host's extension builds",
	"TestTimescaleDB_HAFailover":                    "kills a postmaster on this host",
	"TestFork_Now":                                  "reads snapshot manifests on this host",
	"TestFork_PointInTime":                          "reads the WAL archive on this host",
	"TestUpdatePassword_TenantLockStallsNobodyElse": "times the local runtime's password path",
	"TestAdmission_RealHost":                        "admits services against this host's capacity",
	"TestPooler_UnstableRepair":                     "kills a PgBouncer on this host",
	"TestCrashBetweenCommitAndResponse":             "kills host processes mid-request",
	"TestGuard_Tenant":                              "connects to 127.0.0.1 and probes the host as tsdbadmin",
	"TestHA":                                        "kills postmasters on this host",
	"TestHistory":                                   "edits instances' files on this host and kills a postmaster",
	"TestGuard_OSIsolation":                         "checks OS users, setpriv and cgroups on this host",
	"TestLoad":                                      "measures host processes",
	"TestPossibleFinal":                             "measures host processes",
	"TestLogs":                                      "rotates and reads log files on this host",
	"TestLogs_NoHostPath":                           "the host paths of this runtime's directories (a pod's paths are the container's own)",
	"TestMetrics_HistoryAndPrometheus":              "compares metrics with host processes",
	"TestMetrics_IdleServiceCostsLess":              "counts the sessions the local runtime opens on its instances",
	"TestPassword_Persists":                         "kills a postmaster on this host",
	"TestPlanes_TwoPlanesOneStore":                  "shares a runtime directory on this host between planes",
	"TestPooler_ManyClients":                        "runs PgBouncer on this host",
	"TestReadme_Walkthrough":                        "the README's walkthrough is the local runtime's",
	"TestReplicaSets":                               "kills a postmaster and reads files on this host",
	"TestRestoreCheck":                              "edits snapshots on this host",
	"TestService_Lifecycle":                         "inspects instances, ports and files on this host",
	"TestService_ResizeWhilePaused":                 "reads instances' settings on this host",
	"TestService_Capacity":                          "admits services against this host's capacity",
	"TestSnapshots_ListAndEvents":                   "the local runtime's snapshots",
	"TestStorageLimit":                              "a disk image on this host (--storage-image-gib)",
	"TestStorageLimit_DefaultFilesystem":            "measures a service's volume on this host's default filesystem",
	"TestStoragePool_CreatesTakeEntries":            "a disk image on this host (--storage-image-gib) and its server's log",
	"TestVPC_AttachDetach":                          "VPC endpoints are loopback addresses of this host (kubernetes answers UNSUPPORTED)",
	"TestVPC_Peerings":                              "VPC peering on this host (kubernetes answers UNSUPPORTED)",
}

// localOnly skips the test, saying what it needs, unless this run is on
// the local runtime. Every local-only test and helper goes through it.
func localOnly(t testing.TB, needs string) {
	t.Helper()
	if onKubernetes() {
		t.Skipf("needs the local runtime: %s (this run: -e2e.runtime=%s)", needs, *e2eRuntime)
	}
}

// requireRuntime lets a test start servers on this run's runtime, or
// skips it when it needs the local one.
func requireRuntime(t testing.TB) {
	t.Helper()
	top, _, _ := strings.Cut(t.Name(), "/")
	if kubernetesTests[top] {
		return
	}
	needs := localReasons[top]
	if needs == "" {
		needs = "not reviewed for other runtimes (add it to kubernetesTests or localReasons in e2e/runtime_test.go)"
	}
	localOnly(t, needs)
}

// runtimeArgs are the serve flags of this run's runtime, unless the test
// chose one itself.
func runtimeArgs(t testing.TB, args []string) []string {
	t.Helper()
	if !onKubernetes() || slices.Contains(args, "--runtime") {
		return nil
	}
	if *e2eKubeconfig == "" {
		t.Fatal("-e2e.runtime=kubernetes needs -e2e.kubeconfig")
	}
	return append([]string{"--runtime", "kubernetes", "--kubeconfig", *e2eKubeconfig}, strings.Fields(*e2eKubeArgs)...)
}

// sslParams is how a client checks the server's certificate. CloudNativePG
// issues its clusters' certificates from a CA of its own, for its Service
// names, not for dbcloud's CA or a load balancer's address: there the
// connection is encrypted but the server is not verified.
func (s *server) sslParams() string {
	if onKubernetes() {
		return "sslmode=require"
	}
	return "sslmode=verify-full&sslrootcert=" + s.boot.CAFile
}

// readyWithin is how long a service may take to become READY: CNPG pulls
// images, binds volumes and runs initdb in a Job.
func readyWithin() time.Duration {
	if onKubernetes() {
		return 10 * time.Minute
	}
	return 90 * time.Second
}

// TestRuntime_ServiceLifecycle is the lifecycle through the API only, so
// it runs on every runtime: create, connect at the endpoint the API
// reports, change the password, stop and start with the data kept, delete
// (on Kubernetes, leaving nothing of the service in its namespace).
func TestRuntime_ServiceLifecycle(t *testing.T) {
	s := newServer(t)
	began := time.Now()
	created := s.create(map[string]any{"name": "portable"})
	id, pw := created.ServiceID, created.InitialPassword
	if created.Endpoint.Port == 0 {
		t.Fatalf("no endpoint in the create response: %+v", created)
	}
	svc := s.waitStatus(id, "READY", readyWithin())
	t.Logf("create to READY: %.1f s", time.Since(began).Seconds())
	ctx := context.Background()
	c := s.mustConnect(svc, pw)
	if _, err := c.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before stop')"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)

	const newPW = "portable-password-2b7"
	var refusal map[string]any
	began = time.Now()
	if code := s.call("POST", s.services()+"/"+id+"/updatePassword", map[string]string{"password": newPW}, &refusal); code != 204 {
		t.Fatalf("updatePassword: %d %v", code, refusal)
	}
	t.Logf("updatePassword: %.1f s", time.Since(began).Seconds())
	s.mustConnect(svc, newPW).Close(ctx)
	if old, err := s.connect(ctx, svc, pw); err == nil {
		old.Close(ctx)
		t.Fatal("the old password still works after updatePassword's 204")
	}

	began = time.Now()
	if code := s.call("POST", s.services()+"/"+id+"/stop", nil, nil); code != 202 {
		t.Fatalf("stop: %d", code)
	}
	s.waitStatus(id, "PAUSED", readyWithin())
	t.Logf("stop to PAUSED: %.1f s", time.Since(began).Seconds())
	began = time.Now()
	if code := s.call("POST", s.services()+"/"+id+"/start", nil, nil); code != 202 {
		t.Fatalf("start: %d", code)
	}
	svc = s.waitStatus(id, "READY", readyWithin())
	t.Logf("start to READY: %.1f s", time.Since(began).Seconds())
	var v string
	c = s.mustConnect(svc, newPW)
	if err := c.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != "before stop" {
		t.Fatalf("after stop and start: %q %v", v, err)
	}
	c.Close(ctx)

	if code := s.call("DELETE", s.services()+"/"+id, nil, nil); code != 202 {
		t.Fatalf("delete: %d", code)
	}
	s.waitGone(id, readyWithin())
	if onKubernetes() {
		kc := kubeClient(t)
		s.checkNothingLeft(kc, id, 2*time.Minute)
		// It was the project's only service.
		s.checkArchiveCopiesGone(kc, 2*time.Minute)
	}
}

// TestRuntimeTables: every test of the suite is either one that runs on
// the kubernetes runtime or one that says what it needs of the local one,
// so a new test is classified when it is written.
func TestRuntimeTables(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" || fn.Name.Name == "TestRuntimeTables" {
				continue
			}
			seen[fn.Name.Name] = true
			if kubernetesTests[fn.Name.Name] == (localReasons[fn.Name.Name] != "") {
				t.Errorf("%s (%s): in exactly one of kubernetesTests and localReasons, please", fn.Name.Name, f)
			}
		}
	}
	for name := range localReasons {
		if !seen[name] {
			t.Errorf("localReasons names %s, which is no test", name)
		}
	}
	for name := range kubernetesTests {
		if !seen[name] {
			t.Errorf("kubernetesTests names %s, which is no test", name)
		}
	}
}
