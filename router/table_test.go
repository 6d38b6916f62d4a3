package router

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/picker"
)

func newTestPicker(t testing.TB) *picker.Picker {
	t.Helper()
	p, err := picker.New(picker.Config{})
	require.NoError(t, err)
	return p
}

func TestTableRoutes(t *testing.T) {
	a, b := newTestPicker(t), newTestPicker(t)
	tab, err := NewTable(TableConfig{
		Pools: []PoolConfig{
			{Name: "llama", Picker: a, Models: []string{"meta-llama/Llama-3.1-8B-Instruct"},
				Adapters: map[string]string{"sql-lora": "meta-llama/Llama-3.1-8B-Instruct"},
				Aliases:  map[string]string{"llama": "meta-llama/Llama-3.1-8B-Instruct", "sql": "sql-lora"}},
			{Name: "qwen", Picker: b, Models: []string{"Qwen/Qwen2.5-7B"}},
		},
		Fallback: "qwen",
	})
	require.NoError(t, err)
	tests := []struct {
		name  string
		body  string
		want  Route
		found bool
	}{
		{"served model", `{"model":"meta-llama/Llama-3.1-8B-Instruct"}`,
			Route{Pool: tab.Pool("llama"), ClientModel: "meta-llama/Llama-3.1-8B-Instruct", Model: "meta-llama/Llama-3.1-8B-Instruct"}, true},
		{"adapter goes to its base pool", `{"model":"sql-lora"}`,
			Route{Pool: tab.Pool("llama"), ClientModel: "sql-lora", Model: "meta-llama/Llama-3.1-8B-Instruct", Adapter: "sql-lora"}, true},
		{"alias rewrites", `{"model":"llama"}`,
			Route{Pool: tab.Pool("llama"), ClientModel: "llama", Model: "meta-llama/Llama-3.1-8B-Instruct", Upstream: "meta-llama/Llama-3.1-8B-Instruct"}, true},
		{"alias of an adapter", `{"model":"sql"}`,
			Route{Pool: tab.Pool("llama"), ClientModel: "sql", Model: "meta-llama/Llama-3.1-8B-Instruct", Adapter: "sql-lora", Upstream: "sql-lora"}, true},
		{"second pool", `{"model":"Qwen/Qwen2.5-7B"}`, Route{Pool: tab.Pool("qwen"), ClientModel: "Qwen/Qwen2.5-7B", Model: "Qwen/Qwen2.5-7B"}, true},
		{"no model takes the fallback", `{"input":"x"}`, Route{Pool: tab.Pool("qwen"), Fallback: true}, true},
		{"non-JSON takes the fallback", `hello`, Route{Pool: tab.Pool("qwen"), Fallback: true}, true},
		{"unknown model", `{"model":"gpt-9"}`, Route{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseRequest("/v1/chat/completions", nil, []byte(tc.body), ParseOptions{})
			require.NoError(t, err)
			rt, err := tab.Route(&p)
			if !tc.found {
				require.ErrorIs(t, err, ErrModelNotFound)
				ae := errorFor(err, 0)
				assert.Equal(t, 404, ae.Status)
				assert.Equal(t, "model_not_found", ae.Code)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, rt)
		})
	}
	assert.Same(t, tab.Pool("llama"), tab.Default())
}

func TestTableModelsJSON(t *testing.T) {
	tab, err := NewTable(TableConfig{
		Pools: []PoolConfig{{Name: "llama", Picker: newTestPicker(t), Models: []string{"base"},
			Adapters: map[string]string{"chat-lora": "base"}, Aliases: map[string]string{"short": "base"}}},
		Created: time.Unix(1796030434, 0),
		OwnedBy: "vllm",
	})
	require.NoError(t, err)
	// The shape of llm-d-inference-sim's /v1/models (fixture models.response.json).
	assert.JSONEq(t, `{"object":"list","data":[
		{"id":"base","object":"model","created":1796030434,"owned_by":"vllm","root":"base","parent":null},
		{"id":"chat-lora","object":"model","created":1796030434,"owned_by":"vllm","root":"chat-lora","parent":"base"},
		{"id":"short","object":"model","created":1796030434,"owned_by":"vllm","root":"base","parent":null}]}`,
		string(tab.ModelsJSON()))
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object string
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(fixture(t, "llm-d-inference-sim/models.response.json"), &list))
	require.NoError(t, json.Unmarshal(tab.ModelsJSON(), &list), "decodes into the fixture's shape")
	assert.Equal(t, "list", list.Object)

	// Each model's entry for GET /v1/models/{model} is its element of the list.
	var full struct{ Data []json.RawMessage }
	require.NoError(t, json.Unmarshal(tab.ModelsJSON(), &full))
	require.Len(t, full.Data, 3)
	for i, id := range []string{"base", "chat-lora", "short"} {
		b, ok := tab.ModelJSON(id)
		require.True(t, ok, id)
		assert.JSONEq(t, string(full.Data[i]), string(b), id)
	}
	for _, id := range []string{"", "nope", "BASE", "base/"} {
		_, ok := tab.ModelJSON(id)
		assert.False(t, ok, "%q is not declared", id)
	}
}

func TestTableManyModels(t *testing.T) {
	var pools []PoolConfig
	pk := newTestPicker(t) // pools may share a picker; one keeps the test fast
	for i := range 300 {
		pools = append(pools, PoolConfig{Name: "pool-" + strconv.Itoa(i), Picker: pk, Models: []string{"model-" + strconv.Itoa(i)}})
	}
	tab, err := NewTable(TableConfig{Pools: pools})
	require.NoError(t, err)
	for _, i := range []int{0, 150, 299} {
		rt, ok := tab.Lookup("model-" + strconv.Itoa(i))
		require.True(t, ok)
		assert.Equal(t, "pool-"+strconv.Itoa(i), rt.Pool.Name)
	}
}

func TestNewTableErrors(t *testing.T) {
	pk := newTestPicker(t)
	tests := []struct {
		name string
		cfg  TableConfig
	}{
		{"no pools", TableConfig{}},
		{"no picker", TableConfig{Pools: []PoolConfig{{Name: "a"}}}},
		{"no name", TableConfig{Pools: []PoolConfig{{Picker: pk}}}},
		{"duplicate pool", TableConfig{Pools: []PoolConfig{{Name: "a", Picker: pk}, {Name: "a", Picker: pk}}}},
		{"duplicate model across pools", TableConfig{Pools: []PoolConfig{
			{Name: "a", Picker: pk, Models: []string{"m"}}, {Name: "b", Picker: pk, Models: []string{"m"}}}}},
		{"adapter named like a model", TableConfig{Pools: []PoolConfig{
			{Name: "a", Picker: pk, Models: []string{"m"}, Adapters: map[string]string{"m": "m"}}}}},
		{"alias outside the pool", TableConfig{Pools: []PoolConfig{
			{Name: "a", Picker: pk, Models: []string{"m"}, Aliases: map[string]string{"x": "other"}}}}},
		{"unknown default", TableConfig{Pools: []PoolConfig{{Name: "a", Picker: pk}}, Default: "b"}},
		{"unknown fallback", TableConfig{Pools: []PoolConfig{{Name: "a", Picker: pk}}, Fallback: "b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewTable(tc.cfg)
			assert.Error(t, err)
		})
	}
}

// TestNewTablePoolHeader: a pool's Header may set end-to-end fields, and
// NewTable refuses, naming the field, those that would split or misframe
// the upstream request or that a proxy must not forward.
func TestNewTablePoolHeader(t *testing.T) {
	pk := newTestPicker(t)
	table := func(h http.Header) error {
		_, err := NewTable(TableConfig{Pools: []PoolConfig{{Name: "a", Picker: pk, Header: h}}})
		return err
	}
	require.NoError(t, table(http.Header{"Authorization": {"Bearer k"}, "x-removed": nil, "X-Two": {"1", "2"}}))
	for _, tc := range []struct {
		h    http.Header
		want string
	}{
		{http.Header{"Bad Name": {"v"}}, `header "Bad Name" is not a valid header field name`},
		{http.Header{"X-Split": {"v\r\nHost: evil"}}, `header "X-Split" has a control character in its value`},
		{http.Header{"Host": {"evil"}}, `header "Host" cannot be set`},
		{http.Header{"content-length": {"1"}}, `header "content-length" cannot be set`},
		{http.Header{"Content-Encoding": {"gzip"}}, `header "Content-Encoding" cannot be set`},
		{http.Header{"Transfer-Encoding": {"chunked"}}, `header "Transfer-Encoding" cannot be set`},
		{http.Header{"Connection": {"close"}}, `header "Connection" cannot be set`},
		{http.Header{"via": {"1.1 elsewhere"}}, `header "via" cannot be set`},
		{http.Header{"X-Key": {"a"}, "x-key": {"b"}}, `is given twice`},
	} {
		err := table(tc.h)
		require.Error(t, err, tc.want)
		assert.Contains(t, err.Error(), `router: pool "a": `)
		assert.Contains(t, err.Error(), tc.want)
	}
}
