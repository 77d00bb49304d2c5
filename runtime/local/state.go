package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"dbcloud/internal/atomicfile"
)

// instancePorts are the internal ports of a service's (or a read replica
// set's) instances, by instance number: part of both state files.
type instancePorts struct {
	Ports map[int]int `json:"ports"`
}

func newInstancePorts() instancePorts { return instancePorts{Ports: map[int]int{}} }

// readState reads a JSON state file of the runtime; nil if there is none.
// The ports map of a state that has one always exists after reading.
func readState[T any](path string) (*T, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var st T
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if p, ok := any(&st).(interface{ ports() *instancePorts }); ok && p.ports().Ports == nil {
		p.ports().Ports = map[int]int{}
	}
	return &st, nil
}

// writeState replaces a JSON state file atomically.
func writeState(path string, st any) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o600)
}

func (p *instancePorts) ports() *instancePorts { return p }
