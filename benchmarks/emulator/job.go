package emulator

import (
	"sync"
	"time"

	"github.com/inferroute/inferroute/benchmarks/engine"
)

// job is one request inside a pod: the engine's view of it and the
// progress its HTTP handler streams. The engine loop updates it under the
// pod's lock and the job's own; the handler reads it under the job's lock
// and waits on notify.
type job struct {
	req     engine.Request
	arrived time.Time
	// stop reports that the request ends with finish_reason "stop" (it
	// gave no max_tokens), not "length".
	stop   bool
	notify chan struct{} // capacity 1: "something changed"

	mu       sync.Mutex
	tokens   int  // output tokens produced so far
	first    bool // the first token was produced
	stalled  bool // preempted: no more tokens until it finishes
	finished bool
	cached   int
	err      error
}

func newJob(stop bool, req engine.Request) *job {
	return &job{req: req, stop: stop, arrived: time.Now(), notify: make(chan struct{}, 1)}
}

// finishStop is the index of the job's finish reason in finishReasons.
func (j *job) finishStop() int {
	if j.stop {
		return 1
	}
	return 0
}

func (j *job) signal() {
	select {
	case j.notify <- struct{}{}:
	default:
	}
}

// decodeStep credits the token of one decode step to a request past its
// first token, keeping the last token for its Finished event.
func (j *job) decodeStep() {
	j.mu.Lock()
	if j.first && !j.stalled && !j.finished && j.tokens < j.req.OutputTokens-1 {
		j.tokens++
		j.mu.Unlock()
		j.signal()
		return
	}
	j.mu.Unlock()
}

func (j *job) firstToken(cached int) {
	j.mu.Lock()
	j.first = true
	j.tokens = max(j.tokens, 1)
	j.cached = cached
	j.mu.Unlock()
	j.signal()
}

func (j *job) preempted() {
	j.mu.Lock()
	if j.first {
		j.stalled = true
	}
	j.mu.Unlock()
}

func (j *job) finish(cached int) {
	j.mu.Lock()
	j.first = true
	j.finished = true
	j.tokens = j.req.OutputTokens
	j.cached = cached
	j.mu.Unlock()
	j.signal()
}

func (j *job) fail(err error) {
	j.mu.Lock()
	if !j.finished {
		j.err = err
	}
	j.mu.Unlock()
	j.signal()
}

// progress is a snapshot of a job.
type progress struct {
	tokens   int
	finished bool
	cached   int
	err      error
}

func (j *job) progress() progress {
	j.mu.Lock()
	defer j.mu.Unlock()
	return progress{tokens: j.tokens, finished: j.finished, cached: j.cached, err: j.err}
}
