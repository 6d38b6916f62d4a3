package prefix_test

import (
	"fmt"

	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// Two turns of one conversation share their leading blocks; an index that
// saw the first turn dispatched to pod-a reports how much of the second
// turn pod-a holds. Turn 1 renders to 8+84+6+62 = 160 bytes (role markers
// plus the texts), two full 64-byte blocks; turn 2 adds 11+25+6+32 bytes,
// 234 in all, three blocks, of which pod-a holds the first two.
func Example() {
	h := prefix.NewHasher(prefix.HashConfig{})
	ix, err := prefix.NewIndex(prefix.IndexConfig{Stride: 1})
	if err != nil {
		panic(err)
	}
	system := `You are a meticulous assistant. Answer briefly, cite sources, and never invent facts.`
	turn1 := []byte(`{"model":"llama","messages":[{"role":"system","content":"` + system + `"},` +
		`{"role":"user","content":"What is the tallest mountain in the Alps, and how high is it?"}]}`)
	turn2 := []byte(`{"model":"llama","messages":[{"role":"system","content":"` + system + `"},` +
		`{"role":"user","content":"What is the tallest mountain in the Alps, and how high is it?"},` +
		`{"role":"assistant","content":"Mont Blanc, 4,806 metres."},` +
		`{"role":"user","content":"And the tallest in the Pyrenees?"}]}`)

	b1, n1, _ := h.HashBody(nil, "llama", "", turn1)
	b2, n2, _ := h.HashBody(nil, "llama", "", turn2)
	fmt.Println("turn 1:", n1, "bytes,", len(b1), "blocks")
	fmt.Println("turn 2:", n2, "bytes,", len(b2), "blocks")

	a := signals.NewEndpoint(signals.EndpointSpec{Name: "pod-a"})
	b := signals.NewEndpoint(signals.EndpointSpec{Name: "pod-b"})
	ix.Dispatched(&signals.Request{PromptBlocks: b1}, a)
	out := make([]float64, 2)
	ix.Match(&signals.Request{PromptBlocks: b2}, []*signals.Endpoint{a, b}, out)
	fmt.Printf("pod-a holds %.2f of turn 2, pod-b %.2f\n", out[0], out[1])
	// Output:
	// turn 1: 160 bytes, 2 blocks
	// turn 2: 234 bytes, 3 blocks
	// pod-a holds 0.67 of turn 2, pod-b 0.00
}
