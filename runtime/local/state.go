package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"dbcloud/internal/atomicfile"
)

// readState reads a JSON state file of the runtime; nil if there is none.
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
