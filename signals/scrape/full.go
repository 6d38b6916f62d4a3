package scrape

import (
	"bytes"
	"fmt"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prom2json"
)

// ParseFull extracts the same Page as Parse, but through a complete parse of
// the page with github.com/prometheus/prom2json (ParseReader, which runs
// expfmt's TextParser and builds every metric family, histograms included).
//
// It is the reference the fast path is tested and benchmarked against, and
// the stricter choice for a one-off read where speed does not matter: it
// rejects anything expfmt rejects (a family declared twice, a histogram
// whose lines are out of order). It is not safe for concurrent use with
// other calls on the same Parser. It blocks until r is drained.
func (p *Parser) ParseFull(r io.Reader) (Page, error) {
	p.reset()
	ch := make(chan *dto.MetricFamily, 64)
	errc := make(chan error, 1)
	go func() { errc <- prom2json.ParseReader(r, ch) }()
	families := make([]*dto.MetricFamily, 0, 64)
	for mf := range ch {
		families = append(families, mf)
	}
	if err := <-errc; err != nil {
		return Page{}, fmt.Errorf("scrape: full parse: %w", err)
	}
	if len(families) == 0 {
		return Page{}, ErrEmptyPage
	}
	for _, mf := range families {
		id, ok := p.cm.index[mf.GetName()]
		if !ok {
			continue
		}
		for _, m := range mf.GetMetric() {
			var v float64
			switch {
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			case m.Untyped != nil:
				v = m.GetUntyped().GetValue()
			default:
				continue // histograms and summaries: no map reads them
			}
			p.pairs = p.pairs[:0]
			h := uint64(fnvOffset)
			for _, lp := range m.GetLabel() {
				name, val := []byte(lp.GetName()), []byte(lp.GetValue())
				p.pairs = append(p.pairs, labelPair{name, val})
				h = fnvByte(fnv(fnvByte(fnv(h, name), '='), val), ',')
			}
			for _, t := range p.cm.names[id] {
				p.observe(t, v, h)
			}
		}
	}
	return p.result(), nil
}

// ParseFullBytes is ParseFull over a byte slice.
func (p *Parser) ParseFullBytes(page []byte) (Page, error) {
	return p.ParseFull(bytes.NewReader(page))
}
