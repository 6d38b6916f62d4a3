package workload

import "math/rand/v2"

// LengthSampler draws (prompt, output) token counts for generated
// requests. Implementations must return prompt >= 1 and output >= 1 and
// must draw only from r, so that generation is deterministic for a seed.
// Generate calls it from one goroutine.
type LengthSampler interface {
	// Sample returns one (prompt, output) pair.
	Sample(r *rand.Rand) (prompt, output int)
}

// LengthDist is an empirical distribution of (prompt, output) pairs, as
// read by LoadLengths from the ShareGPT or arXiv statistics. Sample draws a
// row uniformly, keeping each row's prompt and output together (their
// correlation matters: long arXiv papers have short summaries). Prompt and
// Output have equal length; the zero value is empty and Sample on it
// returns (1, 1). A LengthDist is safe for concurrent use once built.
type LengthDist struct {
	// Prompt holds the prompt lengths in tokens, each >= 1.
	Prompt []int
	// Output holds the output lengths in tokens, each >= 1, aligned with
	// Prompt.
	Output []int
}

var _ LengthSampler = LengthDist{}

// Len returns the number of pairs.
func (d LengthDist) Len() int { return len(d.Prompt) }

// Sample implements LengthSampler.
func (d LengthDist) Sample(r *rand.Rand) (prompt, output int) {
	if len(d.Prompt) == 0 {
		return 1, 1
	}
	i := r.IntN(len(d.Prompt))
	return d.Prompt[i], d.Output[i]
}

// Clip returns a new distribution with prompts capped at maxPrompt and
// outputs at maxOutput (a cap <= 0 means none), for a model whose context
// is shorter than the dataset's. d is not modified.
func (d LengthDist) Clip(maxPrompt, maxOutput int) LengthDist {
	out := LengthDist{Prompt: make([]int, len(d.Prompt)), Output: make([]int, len(d.Output))}
	for i := range d.Prompt {
		out.Prompt[i], out.Output[i] = d.Prompt[i], d.Output[i]
		if maxPrompt > 0 {
			out.Prompt[i] = min(out.Prompt[i], maxPrompt)
		}
		if maxOutput > 0 {
			out.Output[i] = min(out.Output[i], maxOutput)
		}
	}
	return out
}

// Fixed is a LengthSampler that always returns the same lengths (values
// below 1 are returned as 1). It draws nothing from r.
type Fixed struct {
	// Prompt is the prompt length in tokens.
	Prompt int
	// Output is the output length in tokens.
	Output int
}

var _ LengthSampler = Fixed{}

// Sample implements LengthSampler.
func (f Fixed) Sample(*rand.Rand) (prompt, output int) {
	return max(f.Prompt, 1), max(f.Output, 1)
}
