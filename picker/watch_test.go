package picker

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

// TestWatchConfigFileRejectsNonPositiveInterval: a zero or negative
// interval is a caller's mistake that WatchConfigFile reports as an error
// at once, like a bad file, rather than a panic in time.NewTicker that
// takes the process down after the first load.
func TestWatchConfigFileRejectsNonPositiveInterval(t *testing.T) {
	path := filepath.Join(t.TempDir(), "picker.yaml")
	require.NoError(t, os.WriteFile(path, []byte("scorers: [{name: kv-cache, weight: 1}]\n"), 0o600))
	for _, interval := range []time.Duration{0, -time.Second} {
		p, _ := newPicker(t, Config{}, []*signals.Endpoint{ep("a", 0, 0, 0)})
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // a correct call would return nil at once
		var err error
		assert.NotPanics(t, func() { err = p.WatchConfigFile(ctx, path, interval) }, "interval %v", interval)
		assert.Error(t, err, "interval %v", interval)
	}
}
