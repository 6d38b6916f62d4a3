package plot

import (
	"io"
	"math/rand/v2"
	"testing"
)

// BenchmarkCDFChart renders a ten-series CDF chart of 6000 points each, the
// size of one routebench scenario's plot.
func BenchmarkCDFChart(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := &Chart{Title: "bench", XLabel: "TTFT (s)", YLabel: "fraction", LogX: true}
	for i := range 10 {
		v := make([]float64, 6000)
		for k := range v {
			v[k] = rng.ExpFloat64() * float64(i+1)
		}
		c.Series = append(c.Series, CDF("s", v))
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.WritePNG(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}
