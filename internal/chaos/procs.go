package chaos

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"dbcloud/runtime/local/proxy"
)

// serviceProcesses finds, from the process table, every live process whose
// command line names a file under runtimeDir/services/<id>/, and the TCP
// addresses each listens on. The process table is the truth here, not the
// runtime's pid files: an orphan is exactly a process nobody's pid file
// names any more.
func serviceProcesses(runtimeDir string) []Process {
	prefix := filepath.Join(runtimeDir, "services") + "/"
	type cand struct {
		p    Process
		ppid int
	}
	cands := map[int]cand{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		id, rest := "", ""
		for _, a := range args {
			if after, ok := strings.CutPrefix(a, prefix); ok {
				id, rest, _ = strings.Cut(after, "/")
				break
			}
		}
		if id == "" {
			continue
		}
		state, ppid, ok := procState(pid)
		if !ok || state == 'Z' {
			continue
		}
		p := Process{PID: pid, ServiceID: id, Kind: Other}
		switch base := filepath.Base(args[0]); {
		case base == "postgres" && len(args) > 2 && args[1] == "-D" && strings.HasSuffix(args[2], "/pgdata"):
			p.Kind = Postmaster
			p.Instance, _, _ = strings.Cut(rest, "/")
		case strings.HasPrefix(base, "pgbouncer"):
			p.Kind = Pooler
		case len(args) > 1 && args[1] == proxy.Command:
			p.Kind = Proxy
		}
		cands[pid] = cand{p, ppid}
	}
	var out []Process
	for pid, c := range cands {
		// A child a postmaster has just forked carries its command line
		// for a moment; only a process whose parent is not a candidate of
		// the same kind is counted as one.
		if parent, ok := cands[c.ppid]; ok && parent.p.Kind == c.p.Kind && parent.p.ServiceID == c.p.ServiceID {
			continue
		}
		c.p.Listens = listening(pid)
		out = append(out, c.p)
	}
	slices.SortFunc(out, func(a, b Process) int { return a.PID - b.PID })
	return out
}

// procState reads a process's state letter and parent from /proc/PID/stat.
func procState(pid int) (byte, int, bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// "pid (comm) S ppid ..."; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || len(stat) < i+4 {
		return 0, 0, false
	}
	fields := strings.Fields(string(stat[i+2:]))
	if len(fields) < 2 {
		return 0, 0, false
	}
	ppid, _ := strconv.Atoi(fields[1])
	return fields[0][0], ppid, true
}

// listening returns the TCP addresses pid listens on: its socket inodes
// matched against the kernel's LISTEN sockets.
func listening(pid int) []string {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	if len(inodes) == 0 {
		return nil
	}
	var out []string
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, l := range listenSockets(table) {
			if inodes[l.inode] {
				out = append(out, l.addr)
			}
		}
	}
	return out
}

type listenSocket struct{ addr, inode string }

// listenSockets parses /proc/net/tcp{,6} for sockets in state LISTEN (0A).
func listenSockets(path string) []listenSocket {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []listenSocket
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" {
			continue
		}
		host, port, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		p, err := strconv.ParseUint(port, 16, 16)
		if err != nil {
			continue
		}
		out = append(out, listenSocket{addr: net.JoinHostPort(procIP(host), strconv.Itoa(int(p))), inode: fields[9]})
	}
	return out
}

// procIP decodes /proc/net's hex address: 32-bit words in host (little
// endian) order.
func procIP(h string) string {
	b, err := hex.DecodeString(h)
	if err != nil || len(b)%4 != 0 {
		return h
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	return net.IP(b).String()
}
