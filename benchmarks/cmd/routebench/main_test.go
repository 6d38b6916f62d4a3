package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRunJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{
		"-scenario", "uniform,prefix", "-policies", "round-robin,least-request",
		"-loads", "0.5", "-requests", "60", "-pods", "2", "-json",
		"-traces", "testdata/none",
	}, &stdout, &stderr)
	require.NoError(t, err)
	var rep struct {
		Scenarios []struct {
			Name     string  `json:"name"`
			Load     float64 `json:"load"`
			Pods     []string
			Policies []struct {
				Name     string  `json:"name"`
				TTFTMean float64 `json:"ttft_mean_s"`
				TTFTP99  float64 `json:"ttft_p99_s"`
				TPOTMean float64 `json:"tpot_mean_s"`
				Goodput  float64 `json:"goodput"`
			} `json:"policies"`
		} `json:"scenarios"`
		Skipped []string `json:"skipped"`
	}
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep), stdout.String())
	require.Len(t, rep.Scenarios, 1)
	s := rep.Scenarios[0]
	assert.Equal(t, "uniform", s.Name)
	assert.Equal(t, 0.5, s.Load)
	assert.Len(t, s.Pods, 2)
	require.Len(t, s.Policies, 2)
	assert.Equal(t, "round-robin", s.Policies[0].Name)
	assert.Equal(t, "least-request", s.Policies[1].Name)
	for _, p := range s.Policies {
		assert.Positive(t, p.TTFTMean)
		assert.GreaterOrEqual(t, p.TTFTP99, p.TTFTMean*0.5)
		assert.Positive(t, p.TPOTMean)
		assert.Positive(t, p.Goodput)
	}
	require.Len(t, rep.Skipped, 1)
	assert.Contains(t, stderr.String(), "skipped prefix")
	assert.Contains(t, stderr.String(), "finished in")
}

func TestRunTable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{
		"-scenario", "hetero", "-policies", "round-robin", "-loads", "0.7",
		"-requests", "60", "-profiles", "h100-llama3-8b,l4-llama3-8b", "-pods", "3", "-progress=false",
	}, &stdout, &stderr)
	require.NoError(t, err)
	out := stdout.String()
	assert.Contains(t, out, "== hetero at 70% load")
	assert.Contains(t, out, "2×h100-llama3-8b + 1×l4-llama3-8b")
	assert.Contains(t, out, "round-robin")
	assert.Empty(t, stderr.String(), "no progress output when disabled")
}

func TestRunFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bad load", []string{"-loads", "x"}, `bad load "x"`},
		{"zero load", []string{"-loads", "0"}, `bad load "0"`},
		{"negative pods", []string{"-pods", "-1"}, "-pods: -1 is negative"},
		{"unknown policy", []string{"-policies", "nope", "-progress=false"}, `unknown policy "nope"`},
		{"unknown scenario", []string{"-scenario", "nope", "-progress=false"}, `unknown scenario "nope"`},
		{"extra args", []string{"foo"}, "unexpected arguments"},
		{"unknown flag", []string{"-nope"}, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, &stdout, &stderr)
			require.Error(t, err)
			assert.Contains(t, err.Error()+stderr.String(), tt.want)
		})
	}
}

func TestSplitList(t *testing.T) {
	assert.Nil(t, splitList(""))
	assert.Nil(t, splitList(" , "))
	assert.Equal(t, []string{"a", "b"}, splitList("a, b,"))
}

// TestRunUnlabelled: -unlabelled takes the GPU labels off the pods and
// nothing else. Round-robin, which reads no label, runs identically; the
// default picker, whose speed priors and scaling read them, does not.
func TestRunUnlabelled(t *testing.T) {
	ttft := func(extra ...string) map[string]float64 {
		var stdout, stderr bytes.Buffer
		args := append([]string{
			"-scenario", "hetero", "-policies", "round-robin,inferroute", "-loads", "0.9",
			"-requests", "400", "-json", "-progress=false", "-traces", "testdata/none",
		}, extra...)
		require.NoError(t, run(context.Background(), args, &stdout, &stderr), stderr.String())
		var rep struct {
			Scenarios []struct {
				Policies []struct {
					Name    string  `json:"name"`
					TTFTP99 float64 `json:"ttft_p99_s"`
				} `json:"policies"`
			} `json:"scenarios"`
		}
		require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep))
		require.Len(t, rep.Scenarios, 1)
		out := map[string]float64{}
		for _, p := range rep.Scenarios[0].Policies {
			out[p.Name] = p.TTFTP99
		}
		return out
	}
	labelled, unlabelled := ttft(), ttft("-unlabelled")
	assert.Equal(t, labelled["round-robin"], unlabelled["round-robin"])
	assert.NotEqual(t, labelled["inferroute"], unlabelled["inferroute"])
}
