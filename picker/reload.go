package picker

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"time"
)

// WatchConfigFile reloads the picker's configuration from path whenever the
// file's content changes, checking every interval, until ctx is done. A
// file that cannot be read, parsed or compiled is logged and the current
// configuration stays in force. The first read happens at once, and its
// error, if any, is returned so a caller can refuse to start on a bad file.
// After that WatchConfigFile blocks until ctx is done and returns nil: run
// it in its own goroutine.
func (p *Picker) WatchConfigFile(ctx context.Context, path string, interval time.Duration) error {
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
