package sim

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/inferroute/inferroute/benchmarks/engine"
	"github.com/inferroute/inferroute/benchmarks/workload"
)

// Scenario is one entry of a suite: a fleet, a workload and an SLO. The
// suite runs every scenario at several loads, each a fraction of the
// fleet's measured capacity for the scenario's workload (MeasureCapacity).
type Scenario struct {
	// Name identifies the scenario on the command line and in reports.
	Name string
	// Description says in a line what the scenario tests.
	Description string
	// Pods is the fleet.
	Pods []Pod
	// Build returns the scenario's workload with at most env.N requests,
	// before rate scaling (the suite scales it to each load).
	Build func(env BuildEnv) (*workload.Workload, error)
	// SLO is the goodput objective; the zero SLO means DefaultSLO.
	SLO SLO
}

// BuildEnv is what a Scenario's Build gets.
type BuildEnv struct {
	// N is the number of requests to build.
	N int
	// Seed seeds generated workloads.
	Seed uint64
	// TracesDir is the folder holding the trace files
	// (mooncake_synthetic_trace.jsonl, AzureLLMInferenceTrace_*.csv).
	TracesDir string
}

// ErrTraceMissing is wrapped by a Build error when a trace file the
// scenario replays is not in BuildEnv.TracesDir; the suite skips such a
// scenario with a message instead of failing.
var ErrTraceMissing = errors.New("trace file not found")

// Profile names used by the default scenarios (benchmarks/engine).
const (
	H100 = "h100-llama3-8b"
	A100 = "a100-llama3-8b"
	L4   = "l4-llama3-8b"
)

// Fleet returns one pod per profile name, with vLLM's defaults for each
// profile plus prefix caching on and maxLoRAs adapter slots (0 means
// vLLM's default of 1). It returns an error for an unknown profile name.
func Fleet(maxLoRAs int, profiles ...string) ([]Pod, error) {
	pods := make([]Pod, len(profiles))
	for i, name := range profiles {
		p, ok := engine.ProfileByName(name)
		if !ok {
			return nil, fmt.Errorf("sim: unknown profile %q (known: %s)", name, strings.Join(ProfileNames(), ", "))
		}
		cfg := engine.DefaultConfig(p)
		cfg.MaxLoRAs = maxLoRAs
		if maxLoRAs > 0 {
			// Keep twice the GPU slots in host memory, so that a swap back
			// is a host-to-device copy, not a load from disk.
			cfg.MaxCPULoRAs = 2 * maxLoRAs
		}
		pods[i] = Pod{Name: fmt.Sprintf("%s-%d", shortName(name), i), Engine: cfg}
	}
	return pods, nil
}

// ProfileNames returns the names of the engine's hardware profiles.
func ProfileNames() []string {
	ps := engine.Profiles()
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return names
}

func shortName(profile string) string {
	if i := strings.IndexByte(profile, '-'); i > 0 {
		return profile[:i]
	}
	return profile
}

func repeat(n int, name string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = name
	}
	return out
}

func mustFleet(maxLoRAs int, profiles ...string) []Pod {
	pods, err := Fleet(maxLoRAs, profiles...)
	if err != nil {
		panic(err) // the default scenarios name known profiles only
	}
	return pods
}

// Trace file names inside BuildEnv.TracesDir.
const (
	MooncakeFile  = "mooncake_synthetic_trace.jsonl"
	AzureCodeFile = "AzureLLMInferenceTrace_code.csv"
	AzureConvFile = "AzureLLMInferenceTrace_conv.csv"
)

func loadTrace(dir, name, tenant string) (*workload.Workload, error) {
	path := filepath.Join(dir, name)
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w (pass -traces DIR)", path, ErrTraceMissing)
		}
		return nil, err
	}
	defer f.Close()
	var w *workload.Workload
	if strings.HasSuffix(name, ".csv") {
		w, err = workload.LoadAzure(f, tenant)
	} else {
		w, err = workload.LoadMooncake(f)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return w, nil
}

// The rates passed to the generators only shape the arrivals: the suite
// rescales every workload to its target load.
const genRate = 10

// DefaultScenarios returns the default suite's scenarios:
//
//   - uniform: 8 identical H100 pods, Poisson arrivals, one tenant, no
//     shared prefixes (ShareGPT-like lengths). Round-robin is near the best
//     here; a signal-driven picker must not lose to it.
//   - hetero: 2 H100, 3 A100 and 3 L4 pods, the same traffic.
//   - bursty: 8 H100 pods, on/off bursts (2 s at 6× the base rate every
//     10 s), four tenants (three with shared system prompts), and LoRA adapters
//     (16, Zipf 1.0, on 60% of requests; 4 slots per pod).
//   - prefix: 8 H100 pods replaying the Mooncake synthetic trace (long
//     prompts, heavy prefix reuse, multi-turn).
//   - azure: 8 H100 pods replaying the Azure 2023 code and conversation
//     traces together as two tenants, in their wall-clock order. The code
//     trace alone has an inter-arrival CV of 13 over its hour
//     (PROVENANCE.md); merged with the smoother conversation trace and cut
//     to the run's first requests the stream's CV is lower (the report
//     prints it), while the code tenant's bursts stay in it.
func DefaultScenarios() []Scenario {
	poisson := func(name string) func(BuildEnv) (*workload.Workload, error) {
		return func(env BuildEnv) (*workload.Workload, error) {
			return workload.Generate(workload.GenConfig{
				Name:     name,
				Seed:     env.Seed,
				N:        env.N,
				Arrivals: workload.Poisson{Rate: genRate},
				Lengths:  ShareGPTLengths,
			})
		}
	}
	return []Scenario{
		{
			Name:        "uniform",
			Description: "8×H100, Poisson, one tenant, no shared prefixes",
			Pods:        mustFleet(0, repeat(8, H100)...),
			Build:       poisson("uniform"),
		},
		{
			Name:        "hetero",
			Description: "2×H100 + 3×A100 + 3×L4, Poisson, one tenant",
			Pods:        mustFleet(0, H100, H100, A100, A100, A100, L4, L4, L4),
			Build:       poisson("hetero"),
		},
		{
			Name:        "bursty",
			Description: "8×H100, on/off bursts, 4 tenants (3 with shared system prompts), 16 LoRA adapters",
			Pods:        mustFleet(4, repeat(8, H100)...),
			Build: func(env BuildEnv) (*workload.Workload, error) {
				return workload.Generate(workload.GenConfig{
					Name: "bursty",
					Seed: env.Seed,
					N:    env.N,
					Arrivals: &workload.OnOff{
						BaseRate: genRate, BurstRate: 6 * genRate,
						On: 2 * time.Second, Off: 8 * time.Second,
					},
					Lengths: ShareGPTLengths,
					Tenants: []workload.Tenant{
						{Name: "support", Weight: 4, SystemPromptTokens: 2048, SystemPrompts: 2},
						{Name: "coding", Weight: 3, SystemPromptTokens: 1536, SystemPrompts: 3},
						{Name: "search", Weight: 2, SystemPromptTokens: 1024, SystemPrompts: 4},
						{Name: "batch", Weight: 1, Priority: -1},
					},
					LoRA: &workload.LoRAConfig{Adapters: 16, ZipfS: 1.0, Fraction: 0.6},
				})
			},
		},
		{
			Name:        "prefix",
			Description: "8×H100, Mooncake synthetic trace replay (long shared prefixes)",
			Pods:        mustFleet(0, repeat(8, H100)...),
			SLO:         SLO{TTFT: 10 * time.Second, TPOT: 100 * time.Millisecond},
			Build: func(env BuildEnv) (*workload.Workload, error) {
				w, err := loadTrace(env.TracesDir, MooncakeFile, "")
				if err != nil {
					return nil, err
				}
				w = w.Limit(env.N)
				w.Name = "mooncake"
				return w, nil
			},
		},
		{
			Name:        "azure",
			Description: "8×H100, Azure 2023 code + conv traces merged as two tenants (code alone: CV≈13 bursts)",
			Pods:        mustFleet(0, repeat(8, H100)...),
			Build: func(env BuildEnv) (*workload.Workload, error) {
				code, err := loadTrace(env.TracesDir, AzureCodeFile, "code")
				if err != nil {
					return nil, err
				}
				conv, err := loadTrace(env.TracesDir, AzureConvFile, "conv")
				if err != nil {
					return nil, err
				}
				return workload.Merge(code, conv).Limit(env.N), nil
			},
		},
	}
}

// TraceScenario returns a scenario replaying the user's trace file on pods
// (see LoadTrace for the formats).
func TraceScenario(path string, pods []Pod) Scenario {
	return Scenario{
		Name:        "trace:" + filepath.Base(path),
		Description: "replay of " + path,
		Pods:        pods,
		Build: func(env BuildEnv) (*workload.Workload, error) {
			w, err := LoadTrace(path)
			if err != nil {
				return nil, err
			}
			return w.Limit(env.N), nil
		},
	}
}

// LoadTrace reads a trace file: a Mooncake trace (JSON lines with
// timestamp, input_length, output_length, hash_ids) or an Azure LLM
// inference trace (CSV with TIMESTAMP, ContextTokens, GeneratedTokens). The
// format comes from the extension (.jsonl or .json, .csv, as
// workload.LoadFile) or, for any other name, from the content: a first
// non-blank byte '{' is Mooncake, anything else Azure.
func LoadTrace(path string) (*workload.Workload, error) {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".jsonl", ".json", ".csv":
		return workload.LoadFile(path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	stem := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	var w *workload.Workload
	if t := bytes.TrimLeft(data, " \t\r\n\ufeff"); len(t) > 0 && t[0] == '{' {
		w, err = workload.LoadMooncake(bytes.NewReader(data))
	} else {
		w, err = workload.LoadAzure(bytes.NewReader(data), stem)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	w.Name = stem
	return w, nil
}
