package scrape_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/scrape"
)

// A Parser reads only the families its map names.
func ExampleParser() {
	p, err := scrape.NewParser(scrape.VLLMMap())
	if err != nil {
		panic(err)
	}
	page, err := p.Parse([]byte(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
vllm:num_requests_running{engine="1",model_name="m"} 2
vllm:num_requests_waiting{engine="0",model_name="m"} 4
vllm:num_requests_waiting{engine="1",model_name="m"} 0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
`))
	if err != nil {
		panic(err)
	}
	fmt.Println("running:", page.Running.Value, "waiting:", page.Waiting.Value, "kv:", page.KVCacheUtilization.Value)
	fmt.Println("hit rate known:", page.PrefixCacheHitRate.Known)
	// Output:
	// running: 5 waiting: 4 kv: 0.5
	// hit rate known: false
}

// A Scraper publishes each scrape on the endpoint; Start runs the loop, and
// Scrape does one scrape synchronously.
func ExampleScraper() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "sglang:num_running_reqs{tp_rank=\"0\"} 8\nsglang:num_running_reqs{tp_rank=\"1\"} 8\nsglang:num_queue_reqs 2\n")
	}))
	defer srv.Close()

	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "pod-0", Address: srv.Listener.Addr().String(), Engine: "sglang"})
	s, err := scrape.New(scrape.Config{})
	if err != nil {
		panic(err)
	}
	defer s.Stop()
	s.SetEndpoints([]*signals.Endpoint{ep})
	if err := s.Scrape(context.Background(), ep); err != nil {
		panic(err)
	}
	m := ep.Metrics()
	fmt.Println("running:", m.Running.Value, "waiting:", m.Waiting.Value, "healthy:", ep.Healthy())
	// Output:
	// running: 8 waiting: 2 healthy: true
}
