package router_test

import (
	"fmt"
	"net/http"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/router"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// ExampleParseRequest reads the routing fields of a chat request, resolves
// its route (a LoRA adapter, so its base model's pool) and prepares the
// picker's request with the prompt's block hashes and token estimate.
func ExampleParseRequest() {
	pk, err := picker.New(picker.Config{})
	if err != nil {
		panic(err)
	}
	table, err := router.NewTable(router.TableConfig{Pools: []router.PoolConfig{{
		Name:     "llama",
		Picker:   pk,
		Models:   []string{"meta-llama/Llama-3.1-8B-Instruct"},
		Adapters: map[string]string{"sql-lora": "meta-llama/Llama-3.1-8B-Instruct"},
	}}})
	if err != nil {
		panic(err)
	}
	body := []byte(`{"model":"sql-lora","stream":true,"max_tokens":64,` +
		`"messages":[{"role":"user","content":"Write a query that lists every customer who ordered twice in May."}]}`)
	hdr := http.Header{"X-Slo-Ttft-Ms": {"500"}}

	p, err := router.ParseRequest("/v1/chat/completions", hdr, body, router.ParseOptions{})
	if err != nil {
		panic(err)
	}
	rt, err := table.Route(&p)
	if err != nil {
		panic(err)
	}
	var req signals.Request
	if err := router.Prepare(&req, &p, rt, body, hdr, prefix.NewHasher(prefix.HashConfig{}), nil); err != nil {
		panic(err)
	}
	fmt.Println("kind:", p.Kind, "stream:", p.Stream)
	fmt.Println("pool:", rt.Pool.Name, "model:", req.Model, "adapter:", req.Adapter)
	fmt.Println("max tokens:", req.MaxOutputTokens, "TTFT objective:", req.SLO.TTFT)
	// The prompt renders as a message separator, "user", a field separator
	// and the 65-byte content: 71 bytes, one full 64-byte block, 71/4 = 17
	// tokens.
	fmt.Println("prompt blocks:", len(req.PromptBlocks), "tokens:", req.PromptTokens)
	// Output:
	// kind: chat.completions stream: true
	// pool: llama model: meta-llama/Llama-3.1-8B-Instruct adapter: sql-lora
	// max tokens: 64 TTFT objective: 500ms
	// prompt blocks: 1 tokens: 17
}
