package scrape

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/inferroute/inferroute/signals"
)

// Page is what one metrics page said about the signals of a MetricMap, before
// it is combined with the previous scrape. Values are as published: not
// clamped, and unknown when the page lacks the metric, repeats a series, or
// holds NaN or ±Inf.
type Page struct {
	Running            signals.Reading
	Waiting            signals.Reading
	KVCacheUtilization signals.Reading
	// PrefixCacheHits and PrefixCacheQueries are the cumulative counters of
	// the first counter pair present on the page (both or neither).
	PrefixCacheHits    signals.Reading
	PrefixCacheQueries signals.Reading
	// PrefixCacheHitRate is the server's own hit-rate gauge.
	PrefixCacheHitRate signals.Reading

	// LoRAKnown reports that the LoRA info metric was present; the adapter
	// lists are then the raw comma-separated labels of its newest series.
	LoRAKnown       bool
	RunningAdapters string
	WaitingAdapters string
	MaxLoRA         int

	// BlockSize and NumBlocks are the KV-cache geometry, 0 if unknown.
	BlockSize int
	NumBlocks int
}

// ErrEmptyPage is returned by Parse for a page with no bytes.
var ErrEmptyPage = errors.New("scrape: empty metrics page")

// ParseError reports a malformed metrics page.
type ParseError struct {
	// Line is the 1-based line number.
	Line int
	// Msg says what is wrong.
	Msg string
}

// Error implements error.
func (e *ParseError) Error() string { return fmt.Sprintf("scrape: line %d: %s", e.Line, e.Msg) }

type field uint8

const (
	fRunning field = iota
	fWaiting
	fKV
	fHitRate
	fBlockSize
	fNumBlocks
	numFields
)

var defaultAgg = [numFields]Aggregation{
	fRunning: AggSum, fWaiting: AggSum, fKV: AggMean,
	fHitRate: AggMax, fBlockSize: AggMax, fNumBlocks: AggMax,
}

type matcher struct{ name, value string }

type slot struct {
	matchers []matcher
	agg      Aggregation
}

type targetKind uint8

const (
	tSlot targetKind = iota
	tLoRA
	tCacheConfig
)

type lookupTarget struct {
	kind targetKind
	slot int32
}

// compiledMap is a MetricMap turned into a lookup table by sample name. It is
// immutable and shared by every Parser of the same map.
type compiledMap struct {
	index  map[string]int32 // sample name -> names index
	names  [][]lookupTarget
	slots  []slot
	fields [numFields][]int32
	pairs  [][2]int32
	lora   *LoRAInfo
	cache  *CacheConfigInfo
	// hashed[id] says whether a name feeds a slot, whose series are
	// hashed to find repeats.
	hashed []bool
	// lengths[n] says whether some wanted name is n bytes long.
	lengths [256]bool
}

func compile(m *MetricMap) (*compiledMap, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	cm := &compiledMap{index: map[string]int32{}}
	add := func(name string, t lookupTarget) {
		id, ok := cm.index[name]
		if !ok {
			id = int32(len(cm.names))
			cm.index[name] = id
			cm.names = append(cm.names, nil)
		}
		cm.names[id] = append(cm.names[id], t)
		if len(name) < len(cm.lengths) {
			cm.lengths[len(name)] = true
		}
	}
	addSlot := func(s Selector, def Aggregation, counter bool) int32 {
		agg := s.Aggregation
		if agg == "" {
			agg = def
		}
		sl := slot{agg: agg}
		for k, v := range s.Labels {
			sl.matchers = append(sl.matchers, matcher{k, v})
		}
		id := int32(len(cm.slots))
		cm.slots = append(cm.slots, sl)
		add(s.Metric, lookupTarget{tSlot, id})
		if counter && !hasSuffix(s.Metric, "_total") {
			add(s.Metric+"_total", lookupTarget{tSlot, id})
		}
		return id
	}
	for f, sels := range [numFields][]Selector{
		fRunning: m.Running, fWaiting: m.Waiting, fKV: m.KVCacheUtilization,
		fHitRate: m.PrefixCacheHitRate, fBlockSize: m.BlockSize, fNumBlocks: m.NumBlocks,
	} {
		for _, s := range sels {
			cm.fields[f] = append(cm.fields[f], addSlot(s, defaultAgg[f], false))
		}
	}
	for _, p := range m.PrefixCacheCounters {
		h := addSlot(p.Hits, AggSum, true)
		q := addSlot(p.Queries, AggSum, true)
		cm.pairs = append(cm.pairs, [2]int32{h, q})
	}
	if m.LoRA != nil {
		l := *m.LoRA
		cm.lora = &l
		add(l.Metric, lookupTarget{kind: tLoRA})
	}
	if m.CacheConfig != nil {
		c := *m.CacheConfig
		cm.cache = &c
		add(c.Metric, lookupTarget{kind: tCacheConfig})
	}
	cm.hashed = make([]bool, len(cm.names))
	for id, ts := range cm.names {
		for _, t := range ts {
			cm.hashed[id] = cm.hashed[id] || t.kind == tSlot
		}
	}
	return cm, nil
}

func hasSuffix(s, suffix string) bool {
	return len(s) >= len(suffix) && s[len(s)-len(suffix):] == suffix
}

// maxSeriesChecked bounds the series per slot checked for repeats. Real
// pages have one series per engine or rank: a handful.
const maxSeriesChecked = 256

type acc struct {
	sum, max  float64
	n         int
	dup       bool
	nonFinite bool
	hashes    []uint64
}

type labelPair struct{ name, value []byte }

// Parser extracts a MetricMap's signals from Prometheus text exposition
// pages. It reads only the lines of the families the map names: every other
// line is skipped after its metric name, so histograms and process metrics
// cost a name scan each. It uses no regular expressions and, once warmed up,
// allocates only when an adapter list changes.
//
// A Parser keeps scratch buffers between calls and is not safe for
// concurrent use; use one per endpoint (the Scraper does).
type Parser struct {
	cm       *compiledMap
	accs     []acc
	typeSeen []bool
	pairs    []labelPair
	scratch  []byte

	lastName []byte // a sub-slice of the page being parsed
	lastID   int32

	loraFound            bool
	loraBest             float64
	loraRun, loraWait    []byte
	loraMax              int
	runStr, waitStr      string
	cacheBlock, cacheNum int
}

// NewParser returns a Parser for m. It returns an error when m is invalid
// (see MetricMap.Validate). m is not retained.
func NewParser(m *MetricMap) (*Parser, error) {
	cm, err := compile(m)
	if err != nil {
		return nil, err
	}
	return newParser(cm), nil
}

func newParser(cm *compiledMap) *Parser {
	return &Parser{
		cm:       cm,
		accs:     make([]acc, len(cm.slots)),
		typeSeen: make([]bool, len(cm.names)),
	}
}

func (p *Parser) reset() {
	for i := range p.accs {
		a := &p.accs[i]
		*a = acc{hashes: a.hashes[:0]}
	}
	clear(p.typeSeen)
	p.lastName, p.lastID = nil, -1
	p.loraFound = false
	p.loraBest = 0
	p.loraRun = p.loraRun[:0]
	p.loraWait = p.loraWait[:0]
	p.loraMax = 0
	p.cacheBlock, p.cacheNum = 0, 0
}

// Parse reads one page in the Prometheus text exposition format (version
// 0.0.4) and returns the map's signals. It never panics on any input and
// reads page only (it neither modifies nor retains it).
//
// It returns ErrEmptyPage for an empty page and a *ParseError for a page
// that is not in the text format: a line starting with a character that
// cannot begin a metric name (an HTML page, binary garbage), a malformed
// line of a family the map reads, or a last line without its newline (a
// page truncated in transit). Lines of other families are not validated
// beyond their metric name.
func (p *Parser) Parse(page []byte) (Page, error) {
	pg, err := p.parse(page)
	p.lastName = nil // do not retain the page
	return pg, err
}

func (p *Parser) parse(page []byte) (Page, error) {
	p.reset()
	if len(page) == 0 {
		return Page{}, ErrEmptyPage
	}
	line := 0
	for off := 0; off < len(page); {
		line++
		nl := bytes.IndexByte(page[off:], '\n')
		if nl < 0 {
			return Page{}, &ParseError{Line: line, Msg: "page truncated: last line has no newline"}
		}
		if msg := p.line(page[off : off+nl]); msg != "" {
			return Page{}, &ParseError{Line: line, Msg: msg}
		}
		off += nl + 1
	}
	return p.result(), nil
}

// nameStart and nameCont classify metric-name bytes: [a-zA-Z_:] then
// [a-zA-Z0-9_:] (Prometheus data model, "Metric names and labels").
var nameStart, nameCont, labelCont = charClasses()

func charClasses() (start, cont, label [256]bool) {
	for c := 0; c < 256; c++ {
		b := byte(c)
		letter := (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '_'
		digit := b >= '0' && b <= '9'
		start[c] = letter || b == ':'
		cont[c] = letter || digit || b == ':'
		label[c] = letter || digit
	}
	return start, cont, label
}

func isBlank(b byte) bool { return b == ' ' || b == '\t' }

// line handles one line without its newline and returns a non-empty message
// when the line is malformed.
func (p *Parser) line(l []byte) string {
	if n := len(l); n > 0 && l[n-1] == '\r' {
		l = l[:n-1]
	}
	i := 0
	for i < len(l) && isBlank(l[i]) {
		i++
	}
	if i == len(l) {
		return ""
	}
	c := l[i]
	if c == '#' {
		p.comment(l[i+1:])
		return ""
	}
	if c == '{' {
		// A quoted UTF-8 metric name (`{"name", ...} v`): none of the maps
		// name such a metric, but the quoting is checked so that a JSON
		// body is not mistaken for metrics.
		return quotedName(l[i+1:])
	}
	if !nameStart[c] {
		return fmt.Sprintf("unexpected %q at start of line", c)
	}
	j := i + 1
	for j < len(l) && nameCont[l[j]] {
		j++
	}
	if j == len(l) {
		return "metric name without a value"
	}
	if d := l[j]; d != '{' && !isBlank(d) {
		return fmt.Sprintf("unexpected %q in metric name", d)
	}
	id := p.lookup(l[i:j])
	if id < 0 {
		return ""
	}
	return p.sample(id, l[j:])
}

// quotedName checks the start of a line in the quoted-name form, after its
// '{': a quoted string, then ',' or '}'.
func quotedName(l []byte) string {
	k := 0
	for k < len(l) && isBlank(l[k]) {
		k++
	}
	if k >= len(l) || l[k] != '"' {
		return "expected a quoted metric name after '{'"
	}
	k++
	for k < len(l) && l[k] != '"' {
		if l[k] == '\\' {
			k++
		}
		k++
	}
	if k >= len(l) {
		return "unterminated quoted metric name"
	}
	k++
	for k < len(l) && isBlank(l[k]) {
		k++
	}
	if k >= len(l) || (l[k] != ',' && l[k] != '}') {
		return "expected ',' or '}' after quoted metric name"
	}
	return ""
}

// lookup returns the index of a wanted sample name, or -1. Most lines are
// rejected by their name's length alone; consecutive lines of one family
// (histogram buckets) reuse the previous answer without hashing.
func (p *Parser) lookup(name []byte) int32 {
	if n := len(name); n < len(p.cm.lengths) && !p.cm.lengths[n] {
		return -1
	}
	if p.lastName != nil && bytes.Equal(name, p.lastName) {
		return p.lastID
	}
	id, ok := p.cm.index[string(name)]
	if !ok {
		id = -1
	}
	p.lastName, p.lastID = name, id
	return id
}

// comment handles "# TYPE name type" lines of the families the map reads: a
// family declared twice makes its signals unknown (which declaration is
// right cannot be told).
func (p *Parser) comment(l []byte) {
	i := 0
	for i < len(l) && isBlank(l[i]) {
		i++
	}
	if !bytes.HasPrefix(l[i:], []byte("TYPE")) {
		return
	}
	i += 4
	if i >= len(l) || !isBlank(l[i]) {
		return
	}
	for i < len(l) && isBlank(l[i]) {
		i++
	}
	j := i
	for j < len(l) && !isBlank(l[j]) {
		j++
	}
	id := p.lookup(l[i:j])
	if id < 0 {
		return
	}
	if p.typeSeen[id] {
		for _, t := range p.cm.names[id] {
			if t.kind == tSlot {
				p.accs[t.slot].dup = true
			}
		}
	}
	p.typeSeen[id] = true
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnv(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= fnvPrime
	}
	return h
}

func fnvByte(h uint64, c byte) uint64 {
	h ^= uint64(c)
	return h * fnvPrime
}

// sample parses the labels and value of a line of a wanted family; rest
// starts right after the metric name.
func (p *Parser) sample(id int32, rest []byte) string {
	p.pairs = p.pairs[:0]
	if cap(p.scratch) < len(rest) {
		p.scratch = make([]byte, 0, 2*len(rest))
	}
	p.scratch = p.scratch[:0]
	h := uint64(fnvOffset)
	hashed := p.cm.hashed[id] // only slots look for repeated series
	k := 0
	if rest[0] == '{' {
		k = 1
		for {
			for k < len(rest) && isBlank(rest[k]) {
				k++
			}
			if k >= len(rest) {
				return "unterminated label set"
			}
			if rest[k] == '}' {
				k++
				break
			}
			s := k
			if !nameStart[rest[k]] || rest[k] == ':' {
				return "invalid label name"
			}
			for k < len(rest) && labelCont[rest[k]] {
				k++
			}
			name := rest[s:k]
			for k < len(rest) && isBlank(rest[k]) {
				k++
			}
			if k >= len(rest) || rest[k] != '=' {
				return "expected '=' after label name"
			}
			k++
			for k < len(rest) && isBlank(rest[k]) {
				k++
			}
			if k >= len(rest) || rest[k] != '"' {
				return "expected '\"' to open label value"
			}
			k++
			vs, esc := k, false
			for k < len(rest) && rest[k] != '"' {
				if rest[k] == '\\' {
					esc = true
					k++
				}
				k++
			}
			if k >= len(rest) {
				return "unterminated label value"
			}
			val := rest[vs:k]
			k++
			if esc {
				val = p.unescape(val)
			}
			p.pairs = append(p.pairs, labelPair{name, val})
			if hashed {
				h = fnvByte(fnv(fnvByte(fnv(h, name), '='), val), ',')
			}
			for k < len(rest) && isBlank(rest[k]) {
				k++
			}
			if k < len(rest) && rest[k] == ',' {
				k++
				continue
			}
			if k < len(rest) && rest[k] == '}' {
				k++
				break
			}
			return "expected ',' or '}' after label value"
		}
	}
	for k < len(rest) && isBlank(rest[k]) {
		k++
	}
	e := k
	for e < len(rest) && !isBlank(rest[e]) {
		e++
	}
	if e == k {
		return "missing value"
	}
	v, err := strconv.ParseFloat(string(rest[k:e]), 64)
	if err != nil {
		return "invalid value"
	}
	for _, t := range p.cm.names[id] {
		p.observe(t, v, h)
	}
	return ""
}

// unescape decodes the text format's label-value escapes (\\, \", \n) into
// the parser's scratch buffer, which sample sized so that it never grows
// within a line: earlier label values stay valid.
func (p *Parser) unescape(raw []byte) []byte {
	s := len(p.scratch)
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c == '\\' && i+1 < len(raw) {
			i++
			switch raw[i] {
			case 'n':
				c = '\n'
			default:
				c = raw[i]
			}
		}
		p.scratch = append(p.scratch, c)
	}
	return p.scratch[s:len(p.scratch):len(p.scratch)]
}

func (p *Parser) label(name string) ([]byte, bool) {
	for _, lp := range p.pairs {
		if string(lp.name) == name {
			return lp.value, true
		}
	}
	return nil, false
}

func (p *Parser) observe(t lookupTarget, v float64, h uint64) {
	switch t.kind {
	case tSlot:
		s := &p.cm.slots[t.slot]
		for _, m := range s.matchers {
			got, _ := p.label(m.name)
			if string(got) != m.value {
				return
			}
		}
		a := &p.accs[t.slot]
		// Repeated series are looked for among the first maxSeriesChecked
		// of a slot only, so that a hostile page of many series costs
		// linear time.
		if len(a.hashes) < maxSeriesChecked {
			for _, x := range a.hashes {
				if x == h {
					a.dup = true
				}
			}
			a.hashes = append(a.hashes, h)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			a.nonFinite = true
		}
		if a.n == 0 || v > a.max {
			a.max = v
		}
		a.sum += v
		a.n++
	case tLoRA:
		p.observeLoRA(v)
	case tCacheConfig:
		bs, ok1 := p.label(p.cm.cache.BlockSizeLabel)
		nb, ok2 := p.label(p.cm.cache.NumBlocksLabel)
		if !ok1 || !ok2 {
			return
		}
		b, n := parseInt(bs), parseInt(nb)
		if b > 0 && n > 0 && (b > p.cacheBlock || (b == p.cacheBlock && n > p.cacheNum)) {
			p.cacheBlock, p.cacheNum = b, n
		}
	}
}

// observeLoRA keeps the series with the largest value (the newest update
// time, vLLM docs/design/metrics.md "LoRA"). Equal values happen when the
// time has one-second resolution (llm-d-inference-sim); the tie goes to the
// larger running list, then the larger waiting list, in byte order, so the
// result does not depend on the order of lines on the page.
func (p *Parser) observeLoRA(v float64) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return
	}
	run, _ := p.label(p.cm.lora.RunningLabel)
	wait, _ := p.label(p.cm.lora.WaitingLabel)
	if p.loraFound {
		if v < p.loraBest {
			return
		}
		if v == p.loraBest {
			c := bytes.Compare(run, p.loraRun)
			if c < 0 || (c == 0 && bytes.Compare(wait, p.loraWait) <= 0) {
				return
			}
		}
	}
	p.loraFound = true
	p.loraBest = v
	p.loraRun = append(p.loraRun[:0], run...)
	p.loraWait = append(p.loraWait[:0], wait...)
	mx, _ := p.label(p.cm.lora.MaxLabel)
	p.loraMax = max(parseInt(mx), 0)
}

// parseInt parses a non-negative decimal integer of at most 9 digits, or
// returns -1.
func parseInt(b []byte) int {
	if len(b) == 0 || len(b) > 9 {
		return -1
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// slotReading returns the aggregated value of a slot and whether the slot
// matched any series. A repeated series or a non-finite sample makes the
// value unknown.
func (p *Parser) slotReading(id int32) (signals.Reading, bool) {
	a := &p.accs[id]
	if a.n == 0 {
		return signals.Reading{}, false
	}
	if a.dup || a.nonFinite {
		return signals.Reading{}, true
	}
	switch p.cm.slots[id].agg {
	case AggMax:
		return signals.Known(a.max), true
	case AggMean:
		return signals.Known(a.sum / float64(a.n)), true
	default:
		return signals.Known(a.sum), true
	}
}

func (p *Parser) fieldReading(f field) signals.Reading {
	for _, id := range p.cm.fields[f] {
		if r, ok := p.slotReading(id); ok {
			return r
		}
	}
	return signals.Reading{}
}

// gaugeInt turns a size gauge into an int, 0 when unknown or out of range.
func gaugeInt(r signals.Reading) int {
	if !r.Known || r.Value < 1 || r.Value > math.MaxInt32 {
		return 0
	}
	return int(r.Value)
}

func (p *Parser) result() Page {
	pg := Page{
		Running:            p.fieldReading(fRunning),
		Waiting:            p.fieldReading(fWaiting),
		KVCacheUtilization: p.fieldReading(fKV),
		PrefixCacheHitRate: p.fieldReading(fHitRate),
	}
	for _, pr := range p.cm.pairs {
		h, okh := p.slotReading(pr[0])
		q, okq := p.slotReading(pr[1])
		if okh && okq {
			pg.PrefixCacheHits, pg.PrefixCacheQueries = h, q
			break
		}
	}
	if p.loraFound {
		pg.LoRAKnown = true
		if string(p.loraRun) != p.runStr {
			p.runStr = string(p.loraRun)
		}
		if string(p.loraWait) != p.waitStr {
			p.waitStr = string(p.loraWait)
		}
		pg.RunningAdapters, pg.WaitingAdapters, pg.MaxLoRA = p.runStr, p.waitStr, p.loraMax
	}
	if p.cacheBlock > 0 {
		pg.BlockSize, pg.NumBlocks = p.cacheBlock, p.cacheNum
	} else {
		pg.BlockSize = gaugeInt(p.fieldReading(fBlockSize))
		pg.NumBlocks = gaugeInt(p.fieldReading(fNumBlocks))
	}
	return pg
}
