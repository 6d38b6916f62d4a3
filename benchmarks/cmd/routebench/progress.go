package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progressBar draws the suite's progress on a terminal, redrawing one line
// with a carriage return; on anything else (a CI log) it prints a line at
// every tenth of the runs. update is called from one goroutine at a time.
type progressBar struct {
	w        io.Writer
	terminal bool
	start    time.Time
	lastTen  int
	drawn    bool
}

func newProgressBar(w io.Writer) *progressBar {
	return &progressBar{w: w, terminal: isTerminal(w), start: time.Now(), lastTen: -1}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

const barWidth = 30

func (p *progressBar) update(done, total int, label string) {
	if total <= 0 {
		return
	}
	elapsed := time.Since(p.start).Round(time.Second)
	if !p.terminal {
		if ten := done * 10 / total; ten != p.lastTen {
			p.lastTen = ten
			fmt.Fprintf(p.w, "routebench: %d/%d runs (%s)\n", done, total, elapsed)
		}
		return
	}
	filled := done * barWidth / total
	bar := strings.Repeat("█", filled) + strings.Repeat("░", barWidth-filled)
	fmt.Fprintf(p.w, "\r%s %3d/%d %-40.40s %s", bar, done, total, label, elapsed)
	p.drawn = true
}

func (p *progressBar) finish(elapsed time.Duration) {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, "routebench: finished in %s\n", elapsed.Round(100*time.Millisecond))
}
