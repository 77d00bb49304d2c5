package local

import (
	"net"
	"testing"

	"dbcloud"
	"dbcloud/runtime/local/internal/proc"
)

func TestParseAppName(t *testing.T) {
	for app, want := range map[string]dbcloud.ReplicationLag{
		appName(2):                   {Ordinal: 2},
		nodeAppName("abcde12345", 0): {ReplicaSetID: "abcde12345", Ordinal: 0},
		nodeAppName("abcde12345", 7): {ReplicaSetID: "abcde12345", Ordinal: 7},
	} {
		if got, ok := parseAppName(app); !ok || got != want {
			t.Errorf("parseAppName(%q) = %+v, %v; want %+v", app, got, ok, want)
		}
	}
	for _, app := range []string{"", "dbcloud", "pg_basebackup", "instance_x", "rs_", "rs_abc_x"} {
		if got, ok := parseAppName(app); ok {
			t.Errorf("parseAppName(%q) = %+v, want no node", app, got)
		}
	}
}

func TestEstablishedOnPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if n := proc.EstablishedOnPort(port); n != 0 {
		t.Fatalf("%d connections before any dial", n)
	}
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
	}
	if n := proc.EstablishedOnPort(port); n != 2 {
		t.Errorf("EstablishedOnPort = %d, want the 2 accepted connections", n)
	}
}
