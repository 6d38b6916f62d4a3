package scrape

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// ParseFull extracts the same Page as Parse, but through a complete parse of
// the page by the Prometheus text parser that github.com/prometheus/prom2json
// uses (github.com/prometheus/common/expfmt), which builds every metric
// family, histograms included.
//
// prom2json.ParseReader itself is not called: it uses the zero value of
// expfmt.TextParser, which panics ("Invalid name validation scheme
// requested: unset") with prometheus/common v0.72.0, the version this
// repository's go.work selects. expfmt.NewDecoder sets the validation scheme
// explicitly and runs the same TextParser.
//
// It is the reference the fast path is tested and benchmarked against, and
// the stricter choice for a one-off read where speed does not matter: it
// rejects anything expfmt rejects (a family declared twice, a histogram
// whose lines are out of order). It is not safe for concurrent use with
// other calls on the same Parser. It blocks until r is drained.
func (p *Parser) ParseFull(r io.Reader) (Page, error) {
	defer p.release()
	p.reset()
	dec := expfmt.NewDecoder(r, expfmt.NewFormat(expfmt.TypeTextPlain))
	var families []*dto.MetricFamily
	for {
		mf := &dto.MetricFamily{}
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Page{}, fmt.Errorf("scrape: full parse: %w", err)
		}
		families = append(families, mf)
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
			for _, lp := range m.GetLabel() {
				p.pairs = append(p.pairs, labelPair{[]byte(lp.GetName()), []byte(lp.GetValue())})
			}
			sortPairs(p.pairs) // expfmt rejects repeated label names
			h := seriesHash(p.pairs)
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
