package local

import (
	"errors"
	"net"
	"slices"
)

// freePort picks a port the kernel has free on the instance host that is
// not in used.
func (rt *Runtime) freePort(used []int) (int, error) {
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(rt.cfg.Host, "0"))
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !slices.Contains(used, port) {
			return port, nil
		}
	}
	return 0, errors.New("no free internal port")
}
