// Command icount is the driver and the report of instructions.sh, which
// counts the user-space instructions each proxy of the overhead benchmark
// executes per request under valgrind's callgrind. Unlike requests/s on a
// shared machine, an instruction count does not move with what else the
// machine is doing, so a change to the request path can be judged by it on
// any machine; it does not see the kernel's share of a request (the
// socket reads and writes, which cost the gateway and minproxy alike) nor
// cache misses.
//
// Usage:
//
//	icount load -url http://127.0.0.1:19190/v1/chat/completions -n 4000 -c 16 -body body.json
//	icount report -n 4000 minproxy.callgrind gateway.callgrind
//
// load sends n POST requests of the body over c keep-alive connections and
// fails unless every answer is a 200. report reads two proxies' callgrind
// dumps (each of exactly n requests; callgrind_annotate's per-function
// listings are read too, see parseAnnotate) and prints, per request, each
// one's instructions by category (inferroute's packages, the runtime's
// allocator, garbage collector and scheduler, net/http, and so on), the
// difference, and the functions of the second that cost the most.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: icount load|report [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "load":
		err = runLoad(os.Args[2:])
	case "report":
		err = runReport(os.Args[2:], os.Stdout)
	default:
		err = fmt.Errorf("unknown command %q (want load or report)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "icount:", err)
		os.Exit(1)
	}
}

func runLoad(args []string) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	url := fs.String("url", "", "URL to POST to")
	n := fs.Int("n", 1000, "requests to send")
	c := fs.Int("c", 16, "connections")
	bodyFile := fs.String("body", "", "file holding the request body")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" || *bodyFile == "" || *n <= 0 || *c <= 0 {
		return errors.New("load needs -url, -body, and positive -n and -c")
	}
	body, err := os.ReadFile(*bodyFile)
	if err != nil {
		return err
	}
	bad, err := load(*url, body, *n, *c)
	if err != nil {
		return err
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d requests failed", bad, *n)
	}
	return nil
}

// load sends n POSTs of body to url over c connections and returns how
// many did not answer 200; err reports the first transport error.
func load(url string, body []byte, n, c int) (bad int64, err error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c, DisableCompression: true}}
	defer client.CloseIdleConnections()
	var (
		next    atomic.Int64
		failed  atomic.Int64
		errOnce sync.Once
		wg      sync.WaitGroup
	)
	for range c {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				req, rerr := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				if rerr != nil {
					errOnce.Do(func() { err = rerr })
					failed.Add(1)
					continue
				}
				req.Header.Set("Content-Type", "application/json")
				resp, rerr := client.Do(req)
				if rerr != nil {
					errOnce.Do(func() { err = rerr })
					failed.Add(1)
					continue
				}
				_, rerr = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if rerr != nil || resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return failed.Load(), err
}

// profile is one callgrind_annotate listing: instructions by function.
type profile struct {
	total int64            // the PROGRAM TOTALS line
	funcs map[string]int64 // function name → self instructions
}

func (p profile) listed() int64 {
	var n int64
	for _, v := range p.funcs {
		n += v
	}
	return n
}

// lineRE matches a function line of callgrind_annotate:
// "   1,234 ( 0.12%)  file.go:pkg.Func [binary]".
var lineRE = regexp.MustCompile(`^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$`)

// recursionRE matches callgrind's suffix for a recursion level.
var recursionRE = regexp.MustCompile(`'[0-9]+$`)

// parseDump reads a callgrind dump in callgrind's own file format
// (valgrind's manual, "Callgrind Format Specification"): a function's self
// cost is the sum of the cost lines under its fn= line, except the line
// after each calls= line, which is the call's inclusive cost. It reads the
// Ir event (instructions) wherever the events: line puts it, follows the
// name compression fn=(id) name / fn=(id), which cfn= lines share, and
// merges a function's recursion levels (f'2) into it. The total is the
// dump's summary: line (totals: without one).
//
// It is what report reads since callgrind_annotate 3.19 was found to
// charge some recursion levels far more than they cost: one listing of
// minproxy summed to 71 times its program total, while the self costs in
// its dump summed to that total exactly.
func parseDump(r io.Reader) (profile, error) {
	p := profile{funcs: make(map[string]int64)}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	names := make(map[string]string) // "(id)" → function name
	npos, ir := 1, -1
	var fn string
	var haveFn, afterCalls, sawTotal, sawSummary bool
	for ln := 1; sc.Scan(); ln++ {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		switch c := line[0]; {
		case c >= '0' && c <= '9' || c == '+' || c == '-' || c == '*':
			if afterCalls {
				afterCalls = false
				continue
			}
			if !haveFn {
				return p, fmt.Errorf("line %d: a cost line before any fn= line", ln)
			}
			if ir < 0 {
				return p, fmt.Errorf("line %d: a cost line before the events: line", ln)
			}
			f := strings.Fields(line)
			if len(f) <= npos+ir {
				continue // a missing event is zero
			}
			v, err := strconv.ParseInt(f[npos+ir], 10, 64)
			if err != nil {
				return p, fmt.Errorf("line %d: cost %q: %w", ln, f[npos+ir], err)
			}
			if v > 0 && p.funcs[fn] > math.MaxInt64-v || v < 0 && p.funcs[fn] < math.MinInt64-v {
				return p, fmt.Errorf("line %d: %s's cost overflows", ln, fn)
			}
			p.funcs[fn] += v
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok {
			key, val, ok = strings.Cut(line, ":")
			if !ok {
				return p, fmt.Errorf("line %d: neither a cost line nor a key: %q", ln, line)
			}
			val = strings.TrimSpace(val)
			switch key {
			case "positions":
				npos = len(strings.Fields(val))
			case "events":
				ir = slices.Index(strings.Fields(val), "Ir")
				if ir < 0 {
					return p, fmt.Errorf("line %d: no Ir among the events %q", ln, val)
				}
			case "summary", "totals":
				f := strings.Fields(val)
				if ir < 0 || len(f) <= ir {
					return p, fmt.Errorf("line %d: %s without an Ir cost", ln, key)
				}
				v, err := strconv.ParseInt(f[ir], 10, 64)
				if err != nil {
					return p, fmt.Errorf("line %d: %s %q: %w", ln, key, f[ir], err)
				}
				if key == "summary" || !sawSummary {
					p.total = v
				}
				sawTotal, sawSummary = true, sawSummary || key == "summary"
			}
			continue
		}
		switch key {
		case "fn", "cfn":
			name, err := compressed(names, val)
			if err != nil {
				return p, fmt.Errorf("line %d: %w", ln, err)
			}
			if key == "fn" {
				fn, haveFn = recursionRE.ReplaceAllString(name, ""), true
			}
		case "calls":
			afterCalls = true
		}
	}
	if err := sc.Err(); err != nil {
		return p, err
	}
	if !sawTotal {
		return p, errors.New("no summary: or totals: line: not a callgrind dump")
	}
	return p, nil
}

// compressed resolves callgrind's name compression: "(id) name" defines
// id, "(id)" refers to it, and a name without an id stands for itself.
func compressed(names map[string]string, val string) (string, error) {
	if !strings.HasPrefix(val, "(") {
		return val, nil
	}
	end := strings.IndexByte(val, ')')
	if end < 0 {
		return "", fmt.Errorf("unterminated name id in %q", val)
	}
	id, name := val[:end+1], strings.TrimSpace(val[end+1:])
	if name != "" {
		names[id] = name
		return name, nil
	}
	name, ok := names[id]
	if !ok {
		return "", fmt.Errorf("name id %s used before it is defined", id)
	}
	return name, nil
}

// isDump reports whether b is a callgrind dump rather than a
// callgrind_annotate listing: dumps begin with their format's header line
// (or, before callgrind 3.x wrote one, with version: or a key line).
func isDump(b []byte) bool {
	first, _, _ := bytes.Cut(bytes.TrimLeft(b, "\n"), []byte("\n"))
	return bytes.HasPrefix(first, []byte("# callgrind format")) || bytes.HasPrefix(first, []byte("version:"))
}

// parseAnnotate reads callgrind_annotate's default (self cost) listing.
// Lines name a function as "file:function [object]"; the file is dropped,
// so that a function inlined from several files counts once.
func parseAnnotate(r io.Reader) (profile, error) {
	p := profile{funcs: make(map[string]int64)}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	sawTotal := false
	for sc.Scan() {
		m := lineRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseInt(strings.ReplaceAll(m[1], ",", ""), 10, 64)
		if err != nil {
			return p, fmt.Errorf("count %q: %w", m[1], err)
		}
		rest := m[2]
		if rest == "PROGRAM TOTALS" {
			p.total, sawTotal = v, true
			continue
		}
		if i := strings.LastIndex(rest, " ["); i >= 0 && strings.HasSuffix(rest, "]") {
			rest = rest[:i]
		}
		// "file:function": the function is after the file's colon. A
		// file name has no colon; a function name may (closures do not,
		// but generic shapes can).
		if i := strings.Index(rest, ":"); i >= 0 {
			rest = rest[i+1:]
		}
		// callgrind marks the recursion levels of a function f'2, f'3:
		// they are one function.
		if m := recursionRE.FindStringIndex(rest); m != nil {
			rest = rest[:m[0]]
		}
		p.funcs[rest] += v
	}
	if err := sc.Err(); err != nil {
		return p, err
	}
	if !sawTotal {
		return p, errors.New("no PROGRAM TOTALS line: not a callgrind_annotate listing")
	}
	return p, nil
}

// categories assign a function to the first whose pattern matches its
// name. The runtime is split into the allocator, the garbage collector and
// the scheduler with the network poller, because a proxy's design moves
// work between them (an allocation per request costs in two places; a
// goroutine per request in the third).
var categories = []struct {
	name string
	re   *regexp.Regexp
}{
	{"inferroute", regexp.MustCompile(`inferroute`)},
	{"OpenTelemetry", regexp.MustCompile(`opentelemetry`)},
	{"runtime: GC", regexp.MustCompile(`^runtime\.(gc|scan|mark|greyobject|findObject|sweep|bgsweep|wbBuf|typePointers|tryDeferToSpanScan|spanOf|\(\*gcWork\)|\(\*gcBits\)|\(\*sweepLocked\)|\(\*mspan\)\.(sweep|mark|typePointers))`)},
	{"runtime: malloc", regexp.MustCompile(`^runtime\.(malloc|newobject|newarray|makeslice|growslice|memclr|nextFreeFast|rawstring|rawbyteslice|slicebytetostring|stringtoslicebyte|concatstring|publicationBarrier|heapSetType|\(\*mcache\)|\(\*mcentral\)|\(\*mheap\)|\(\*mspan\)|\(\*pageAlloc\)|\(\*pallocBits\)|\(\*pageCache\)|\(\*consistentHeapStats\)|\(\*sysMemStat\))`)},
	{"runtime: scheduler, netpoll, timers", regexp.MustCompile(`^runtime\.(schedule|findRunnable|park|gopark|goready|ready|runq|execute|gogo|mcall|netpoll|wakep|startm|stopm|mPark|notesleep|notewakeup|futex|lock|unlock|casgstatus|exitsyscall|entersyscall|reentersyscall|checkTimers|nanotime|resetspinning|newproc|goexit|gfget|gfput|systemstack|acquirep|releasep|handoffp|sysmon|usleep|osyield|chansend|chanrecv|send|recv|selectgo|semacquire|semrelease|injectglist|stealWork|procyield|pidle|goschedIfBusy|wakeNetPoller|\(\*timer\)|\(\*timers\)|\(\*pollDesc\)|poll_runtime|runtime_poll)|^internal/poll\.runtime_poll`)},
	{"runtime: maps, hashing, memmove, other", regexp.MustCompile(`^runtime\.|^internal/runtime|^internal/bytealg|^aeshash|^memeqbody|^indexbyte|^cmpbody|^internal/chacha8rand|^internal/sync`)},
	{"syscalls", regexp.MustCompile(`^syscall\.|^internal/poll|^internal/syscall`)},
	{"net/http", regexp.MustCompile(`^net/http`)},
	{"net/textproto (header keys)", regexp.MustCompile(`^net/textproto`)},
	{"net, net/url", regexp.MustCompile(`^net[./]`)},
	{"proxy's main package", regexp.MustCompile(`^main\.`)},
	{"bufio, bytes, strings, strconv, time, sync, context", regexp.MustCompile(`^(bufio|bytes|strings|internal/strconv|strconv|time|sync|context|unicode|io|sort|slices|errors|math|hash|encoding|fmt|reflect)[./]`)},
}

func category(fn string) string {
	for _, c := range categories {
		if c.re.MatchString(fn) {
			return c.name
		}
	}
	return "other"
}

func runReport(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	n := fs.Int64("n", 0, "requests in each dump")
	top := fs.Int("top", 25, "functions of the second listing to print")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n <= 0 || fs.NArg() != 2 {
		return errors.New("report needs -n and two callgrind_annotate listings: base, then target")
	}
	var ps [2]profile
	var names [2]string
	for i := range ps {
		b, err := os.ReadFile(fs.Arg(i))
		if err != nil {
			return err
		}
		if isDump(b) {
			ps[i], err = parseDump(bytes.NewReader(b))
		} else {
			ps[i], err = parseAnnotate(bytes.NewReader(b))
		}
		if err != nil {
			return fmt.Errorf("%s: %w", fs.Arg(i), err)
		}
		base := filepath.Base(fs.Arg(i))
		names[i] = strings.TrimSuffix(base, filepath.Ext(base))
	}
	report(w, *n, names, ps, *top)
	return nil
}

func report(w io.Writer, n int64, names [2]string, ps [2]profile, top int) {
	per := func(v int64) float64 { return float64(v) / float64(n) }
	fmt.Fprintf(w, "user-space instructions per request (callgrind, %d requests each): %s %.0f, %s %.0f, difference %.0f (%.2fx)\n",
		n, names[0], per(ps[0].total), names[1], per(ps[1].total), per(ps[1].total-ps[0].total), float64(ps[1].total)/float64(ps[0].total))
	var sums [2]map[string]int64
	for i := range ps {
		sums[i] = make(map[string]int64)
		for fn, v := range ps[i].funcs {
			sums[i][category(fn)] += v
		}
	}
	var cats []string
	for c := range sums[0] {
		cats = append(cats, c)
	}
	for c := range sums[1] {
		if _, ok := sums[0][c]; !ok {
			cats = append(cats, c)
		}
	}
	sort.Slice(cats, func(i, j int) bool {
		di, dj := sums[1][cats[i]]-sums[0][cats[i]], sums[1][cats[j]]-sums[0][cats[j]]
		if di != dj {
			return di > dj
		}
		return cats[i] < cats[j]
	})
	fmt.Fprintf(w, "| %-52s | %10s | %10s | %10s |\n", "category", names[0], names[1], "difference")
	fmt.Fprintf(w, "|%s|%s|%s|%s|\n", strings.Repeat("-", 54), strings.Repeat("-", 12), strings.Repeat("-", 12), strings.Repeat("-", 12))
	for _, c := range cats {
		fmt.Fprintf(w, "| %-52s | %10.0f | %10.0f | %+10.0f |\n", c, per(sums[0][c]), per(sums[1][c]), per(sums[1][c]-sums[0][c]))
	}
	// The functions' self costs add up to the program's total within a
	// fraction of a percent (callgrind charges a few instructions around
	// a dump to both); the table's total is the sum of its rows.
	fmt.Fprintf(w, "| %-52s | %10.0f | %10.0f | %+10.0f |\n", "total of the rows", per(ps[0].listed()), per(ps[1].listed()), per(ps[1].listed()-ps[0].listed()))
	for i, p := range ps {
		if d := p.listed() - p.total; d > p.total/100 || -d > p.total/100 {
			fmt.Fprintf(w, "warning: %s's functions add up to %.0f instructions per request, not its total %.0f: the rows above do not account for its instructions (callgrind_annotate 3.19's listings misattribute recursion levels; give report the callgrind dump)\n",
				names[i], per(p.listed()), per(p.total))
		}
	}
	type fv struct {
		fn string
		v  int64
	}
	var fns []fv
	for fn, v := range ps[1].funcs {
		fns = append(fns, fv{fn, v})
	}
	sort.Slice(fns, func(i, j int) bool {
		if fns[i].v != fns[j].v {
			return fns[i].v > fns[j].v
		}
		return fns[i].fn < fns[j].fn
	})
	if top > len(fns) {
		top = len(fns)
	}
	fmt.Fprintf(w, "\n%s's %d costliest functions, instructions per request (self; %s's beside):\n", names[1], top, names[0])
	for _, f := range fns[:top] {
		fmt.Fprintf(w, "%8.0f %8.0f  %s\n", per(f.v), per(ps[0].funcs[f.fn]), f.fn)
	}
}
