package picker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"
)

// WatchConfigFile reloads the picker's configuration from path whenever the
// file's content changes, checking every interval, until ctx is done. A
// file that cannot be read, parsed or compiled is logged and the current
// configuration stays in force. The first read happens at once, and its
// error, if any, is returned so a caller can refuse to start on a bad file.
// An empty file is an error too: a writer that truncates before writing
// leaves one for a moment. Replace the file by renaming a complete one into
// place (as Kubernetes does for ConfigMap volumes), so that a half-written
// file, which may still parse, is never read.
// After that WatchConfigFile blocks until ctx is done and returns nil: run
// it in its own goroutine. A non-positive interval is an error, returned at
// once without reading the file.
func (p *Picker) WatchConfigFile(ctx context.Context, path string, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("picker: config watch interval %v is not positive", interval)
	}
	last, err := p.loadFile(path, nil)
	if err != nil {
		return err
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			data, err := p.loadFile(path, last)
			if err != nil {
				p.opts.logger.LogAttrs(ctx, slog.LevelWarn, "config reload failed; keeping the current configuration",
					slog.String("path", path), slog.String("error", err.Error()))
				last = data // do not log the same bad content every tick
				continue
			}
			last = data
		}
	}
}

// errEmptyConfig is the error for a configuration file with nothing in it.
var errEmptyConfig = errors.New("configuration file is empty")

// loadFile reads path and, if its content differs from last, applies it.
// It returns the content read.
func (p *Picker) loadFile(path string, last []byte) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return last, err
	}
	if last != nil && bytes.Equal(data, last) {
		return data, nil
	}
	if len(bytes.TrimSpace(data)) == 0 {
		// A writer that truncates before writing exposes an empty file for
		// a moment; applying it would swap in the defaults.
		return data, errEmptyConfig
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return data, err
	}
	if err := p.Reconfigure(cfg); err != nil {
		return data, err
	}
	p.opts.logger.LogAttrs(context.Background(), slog.LevelInfo, "config loaded", slog.String("path", path))
	return data, nil
}
