package engine_test

import (
	"fmt"
	"time"

	"github.com/inferroute/inferroute/benchmarks/engine"
)

// Example drives one simulated H100 pod in virtual time: two requests with
// the same 100-token prompt, one after the other. The second finds the
// first's six full 16-token blocks in the prefix cache.
func Example() {
	p, _ := engine.ProfileByName("h100-llama3-8b")
	e := engine.New(engine.DefaultConfig(p))
	prompt := []uint64{11, 12, 13, 14, 15, 16, 17} // content-block ids, 16 tokens each
	var (
		now    time.Duration
		events []engine.Event
	)
	for id := uint64(1); id <= 2; id++ {
		r := &engine.Request{ID: id, Blocks: prompt, BlockTokens: 16, PromptTokens: 100, OutputTokens: 3}
		if err := e.Add(now, r); err != nil {
			panic(err)
		}
		for {
			d, ok := e.StartStep(now)
			if !ok {
				break
			}
			now += d
			events = e.FinishStep(now, events[:0])
			for _, ev := range events {
				fmt.Printf("request %d: %v (cached %d tokens)\n", ev.Req.ID, ev.Kind, ev.CachedTokens)
			}
		}
	}
	st := e.Stats()
	fmt.Printf("prefix cache: %d of %d prompt tokens hit\n", st.PrefixHits, st.PrefixQueries)
	// Output:
	// request 1: FirstToken (cached 0 tokens)
	// request 1: Finished (cached 0 tokens)
	// request 2: FirstToken (cached 96 tokens)
	// request 2: Finished (cached 96 tokens)
	// prefix cache: 96 of 200 prompt tokens hit
}
