package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"dbcloud/internal/pgbin"
)

// Machine describes where the numbers were taken: they mean little
// without it.
type Machine struct {
	CPU       string  `json:"cpu"`
	Cores     int     `json:"cores"`
	MemoryGiB float64 `json:"memory_gib"`
	OS        string  `json:"os"`
	Kernel    string  `json:"kernel"`
	// DataDir is where the benchmarks keep service data (the temporary
	// directory: e2e servers and the log data live there), and
	// Filesystem its type and device.
	DataDir    string `json:"data_dir"`
	Filesystem string `json:"filesystem"`
	Go         string `json:"go"`
	PostgreSQL string `json:"postgresql"`
	Commit     string `json:"commit"`
}

func describeMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), DataDir: os.TempDir()}
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.CPU = field(string(raw), "model name", ':')
	}
	if raw, err := os.ReadFile("/proc/meminfo"); err == nil {
		kb, _ := strconv.ParseFloat(strings.Fields(field(string(raw), "MemTotal", ':') + " 0")[0], 64)
		m.MemoryGiB = float64(int(kb/(1<<20)*10+0.5)) / 10
	}
	if raw, err := os.ReadFile("/etc/os-release"); err == nil {
		m.OS = strings.Trim(field(string(raw), "PRETTY_NAME", '='), `"`)
	}
	if raw, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(raw))
	}
	if f := strings.Fields(output("df", "--output=fstype,source", m.DataDir)); len(f) >= 4 {
		m.Filesystem = f[2] + " on " + f[3]
	}
	m.Go = output("go", "env", "GOVERSION")
	m.PostgreSQL = output(filepath.Join(pgbin.Dir(), "postgres"), "--version")
	m.Commit = output("git", "rev-parse", "--short", "HEAD")
	if output("git", "status", "--porcelain", "--untracked-files=no") != "" {
		m.Commit += " (with uncommitted changes)"
	}
	return m
}

// field returns the value of the first "key<sep>value" line of text.
func field(text, key string, sep byte) string {
	for _, l := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(l, string(sep))
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// output is a command's trimmed output, or "" if it fails.
func output(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// LoadAverage is /proc/loadavg's 1, 5 and 15 minute averages.
type LoadAverage [3]float64

func loadAverage() LoadAverage {
	var l LoadAverage
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	f := strings.Fields(string(raw))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
}

func (l LoadAverage) String() string {
	return strconv.FormatFloat(l[0], 'f', 2, 64) + " " + strconv.FormatFloat(l[1], 'f', 2, 64) + " " + strconv.FormatFloat(l[2], 'f', 2, 64)
}
