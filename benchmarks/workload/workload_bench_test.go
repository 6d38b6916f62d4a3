package workload

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func readTrace(b *testing.B, name string) []byte {
	b.Helper()
	data, err := os.ReadFile(filepath.Join(tracesDir, name))
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkLoadMooncake parses the 3,993-row Mooncake synthetic trace from
// memory.
func BenchmarkLoadMooncake(b *testing.B) {
	data := readTrace(b, "mooncake_synthetic_trace.jsonl")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := LoadMooncake(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoadAzure parses the 19,366-row Azure conv trace from memory.
func BenchmarkLoadAzure(b *testing.B) {
	data := readTrace(b, AzureConvFile)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := LoadAzure(bytes.NewReader(data), "conv"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoadLengths parses the 30,731-row ShareGPT length statistics.
func BenchmarkLoadLengths(b *testing.B) {
	data := readTrace(b, "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := LoadLengths(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGenerate builds 10,000 requests of a bursty multi-tenant
// conversational workload with LoRA adapters (16-token blocks).
func BenchmarkGenerate(b *testing.B) {
	lengths, err := LoadLengths(bytes.NewReader(readTrace(b, "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")))
	if err != nil {
		b.Fatal(err)
	}
	cfg := GenConfig{
		Name: "bench", Seed: 1, N: 10000,
		Arrivals: &OnOff{BaseRate: 5, BurstRate: 50, On: 2 * time.Second, Off: 8 * time.Second},
		Lengths:  lengths.Clip(2048, 1024),
		Tenants: []Tenant{
			{Name: "a", Weight: 2, SystemPromptTokens: 1000, SystemPrompts: 4},
			{Name: "b", Weight: 1, SystemPromptTokens: 300},
		},
		Conversations: &ConvConfig{Sessions: 64, TurnsMean: 3, ThinkTime: time.Second, MaxPromptTokens: 8192},
		LoRA:          &LoRAConfig{Adapters: 8, ZipfS: 1, Fraction: 0.3},
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Generate(cfg); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStats summarises the Mooncake trace (121,877 blocks).
func BenchmarkStats(b *testing.B) {
	w, err := LoadMooncake(bytes.NewReader(readTrace(b, "mooncake_synthetic_trace.jsonl")))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = w.Stats()
	}
}
