package scrape

import (
	"bytes"
	"math"
	"path/filepath"
	"testing"

	"github.com/inferroute/inferroute/signals"
)

// FuzzParse feeds arbitrary pages to the fast parser of every built-in map.
// It is seeded with every fixture page and a few hostile ones. Whatever the
// input, Parse must not panic, must not modify the page, must be
// deterministic on a warm parser, and must never report a non-finite known
// value or a negative size.
//
//	go test -run='^$' -fuzz=FuzzParse -fuzztime=5s ./signals/scrape
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob(filepath.Join(fixtureDir, "*.prom"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no fixtures in %s: %v", fixtureDir, err)
	}
	for _, file := range files {
		f.Add(readFixture(f, filepath.Base(file)))
	}
	for _, s := range []string{
		"",
		"<html><body>502</body></html>\n",
		"vllm:num_requests_running{a=\"\\\"\\\\\\n\"} NaN\n",
		"vllm:lora_requests_info{running_lora_adapters=\"a,b\",max_lora=\"99999999999\"} 1e308\n",
		"# TYPE vllm:num_requests_running gauge\n# TYPE vllm:num_requests_running gauge\n",
		"{\"q\"} 1\n{\"q\",a=\"b\"} 2\n",
		"vllm:num_requests_running{",
	} {
		f.Add([]byte(s))
	}

	var parsers []*Parser
	for _, e := range BuiltinEngines() {
		m, _ := BuiltinMap(e)
		p, err := NewParser(m)
		if err != nil {
			f.Fatal(err)
		}
		parsers = append(parsers, p)
	}

	f.Fuzz(func(t *testing.T, page []byte) {
		orig := bytes.Clone(page)
		for _, p := range parsers {
			got, err := p.Parse(page)
			if !bytes.Equal(page, orig) {
				t.Fatal("Parse modified its input")
			}
			again, err2 := p.Parse(page)
			if (err == nil) != (err2 == nil) || got != again {
				t.Fatalf("Parse is not deterministic: %v/%v, %+v vs %+v", err, err2, got, again)
			}
			if err != nil {
				if got != (Page{}) {
					t.Fatalf("error %v with a non-empty page %+v", err, got)
				}
				continue
			}
			for _, r := range []signals.Reading{got.Running, got.Waiting, got.KVCacheUtilization,
				got.PrefixCacheHits, got.PrefixCacheQueries, got.PrefixCacheHitRate} {
				if r.Known && (math.IsNaN(r.Value) || math.IsInf(r.Value, 0)) {
					t.Fatalf("known non-finite reading %v", r.Value)
				}
				if !r.Known && r.Value != 0 {
					t.Fatalf("unknown reading with a value %v", r.Value)
				}
			}
			if got.MaxLoRA < 0 || got.BlockSize < 0 || got.NumBlocks < 0 {
				t.Fatalf("negative size in %+v", got)
			}
			if !got.LoRAKnown && (got.RunningAdapters != "" || got.WaitingAdapters != "" || got.MaxLoRA != 0) {
				t.Fatalf("adapters without LoRA info: %+v", got)
			}
		}
	})
}
