package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// banner tells a person at the terminal, at every start, where the API,
// the CA and the credentials are and how services are stopped: the log
// lines say the same for machines, but a newcomer reads this.
func (m *Main) banner() {
	if m.stderr == nil {
		return
	}
	dir, _ := filepath.Abs(m.Config.DataDir)
	creds := filepath.Join(dir, "bootstrap.json")
	credsNote := "(project_id, access_key, secret_key; readable by you only)"
	project := "ID"
	if raw, err := os.ReadFile(creds); err == nil {
		var b bootstrapFile
		if json.Unmarshal(raw, &b) == nil && b.ProjectID != "" {
			project = b.ProjectID
		}
	}
	if _, err := os.Stat(creds); err != nil {
		credsNote = "(none: this store was not bootstrapped here; create a key with `dbcloud admin key create`)"
	}
	ca := m.CAFile
	if ca == "" {
		ca = "(none: --tls-cert is a certificate your clients already trust)"
	}
	flags := ""
	if dir != mustAbs(DefaultConfig().DataDir) {
		flags = " --data-dir " + shellQuote(dir)
	}
	if m.Config.Store != "" {
		flags += " --store ..."
	}
	fmt.Fprintf(m.stderr, `
dbcloud is serving.
  API          %s
  CA file      %s
  Credentials  %s
               %s
  Data         %s

Services keep running when dbcloud stops (Ctrl-C): they do not depend on it.
  Stop them all:                %[6]s admin service stop-all%[7]s
  Delete every service and stop
  everything dbcloud started:   %[6]s admin teardown%[7]s   (after Ctrl-C)
  List services:                %[6]s admin service list --project %[8]s%[7]s

`, m.URL(), ca, creds, credsNote, dir, self(), flags, project)
}

// self is how the person started this binary, so the commands shown can
// be pasted: ./dbcloud from scripts/run.sh, dbcloud from the PATH.
func self() string {
	if len(os.Args) > 0 && filepath.Base(os.Args[0]) == "dbcloud" {
		return shellQuote(os.Args[0])
	}
	return "dbcloud"
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
