package scrape

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/inferroute/inferroute/signals"
)

// Page is what one metrics page said about the signals of a MetricMap, before
// it is combined with the previous scrape. Values are as published: not
// clamped, and unknown when the page lacks the metric, repeats a series, or
// holds NaN or ±Inf. A series is its label set: the order its labels are
// written in does not matter, and a label with an empty value is the same
// as no label (Prometheus semantics).
type Page struct {
	Running            signals.Reading
	Waiting            signals.Reading
	KVCacheUtilization signals.Reading
	// PrefixCacheHits and PrefixCacheQueries are the cumulative counters of
	// the first counter pair present on the page: both known or neither (a
	// pair with one side unknown leaves both unknown).
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
// allocates only when an adapter list changes (or when a line it reads has
// more than 64 labels).
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

// maxPairsKept bounds the label-pair scratch kept from one page to the
// next, so that a line of many labels does not keep its buffer (or make
// release clear it on every page).
const maxPairsKept = 64

func (p *Parser) reset() {
	if cap(p.pairs) > maxPairsKept {
		p.pairs = nil
	}
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
// page truncated in transit). A line of a read family is malformed where
// expfmt would reject it (a bad label set, escape or value, a repeated label
// name); after the value it may carry a timestamp, as integer milliseconds
// or OpenMetrics decimal seconds, and an OpenMetrics exemplar ("# {...}"),
// and nothing else. Lines of other families are not validated beyond their
// metric name.
func (p *Parser) Parse(page []byte) (Page, error) {
	return p.parse(page)
}

// release drops the parser's references into the page just parsed, so that
// the page is not retained: the last metric name looked up, and the label
// pairs (all of their capacity, which every parse leaves zeroed).
func (p *Parser) release() {
	p.lastName = nil
	clear(p.pairs[:cap(p.pairs)])
}

func (p *Parser) parse(page []byte) (Page, error) {
	defer p.release()
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

// hashSeed starts a series hash; hashMul is an odd 64-bit constant (2^64
// divided by the golden ratio).
const (
	hashSeed = 0x243f6a8885a308d3
	hashMul  = 0x9e3779b97f4a7c15
)

// mix folds the word w into the hash h: the two halves of the 128-bit
// product of h^w and hashMul, xored (the "mum" step of wyhash).
func mix(h, w uint64) uint64 {
	hi, lo := bits.Mul64(h^w, hashMul)
	return hi ^ lo
}

// mixBytes folds b into h eight bytes at a time, the last word zero-padded
// (the caller folds in the length, which tells the padding apart).
func mixBytes(h uint64, b []byte) uint64 {
	for len(b) >= 8 {
		h = mix(h, binary.LittleEndian.Uint64(b))
		b = b[8:]
	}
	if len(b) > 0 {
		var w uint64
		for i, c := range b {
			w |= uint64(c) << (8 * i)
		}
		h = mix(h, w)
	}
	return h
}

// sample parses the labels, value and trailer of a line of a wanted family;
// rest starts right after the metric name. As in expfmt, a label value must
// be UTF-8 with only the escapes \\, \" and \n, a label name may not repeat
// or be __name__, and the value is a Go float without hexadecimal mantissa
// or digit separators.
func (p *Parser) sample(id int32, rest []byte) string {
	p.pairs = p.pairs[:0]
	if cap(p.scratch) < len(rest) {
		p.scratch = make([]byte, 0, 2*len(rest))
	}
	p.scratch = p.scratch[:0]
	k := skipBlanks(rest, 0) // blanks may separate the name from '{'
	if k < len(rest) && rest[k] == '{' {
		k++
		for {
			k = skipBlanks(rest, k)
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
			if string(name) == "__name__" {
				return "reserved label name __name__"
			}
			k = skipBlanks(rest, k)
			if k >= len(rest) || rest[k] != '=' {
				return "expected '=' after label name"
			}
			k = skipBlanks(rest, k+1)
			if k >= len(rest) || rest[k] != '"' {
				return "expected '\"' to open label value"
			}
			k++
			vs, esc, high := k, false, byte(0)
			for k < len(rest) && rest[k] != '"' {
				high |= rest[k]
				if rest[k] == '\\' {
					esc = true
					k++
					if k < len(rest) && rest[k] != '\\' && rest[k] != '"' && rest[k] != 'n' {
						return "invalid escape sequence in label value"
					}
				}
				k++
			}
			if k >= len(rest) {
				return "unterminated label value"
			}
			val := rest[vs:k]
			k++
			if high >= utf8.RuneSelf && !utf8.Valid(val) {
				return "label value is not valid UTF-8"
			}
			if esc {
				val = p.unescape(val)
			}
			p.pairs = append(p.pairs, labelPair{name, val})
			k = skipBlanks(rest, k)
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
		if !sortPairs(p.pairs) {
			return "duplicate label name"
		}
	}
	k = skipBlanks(rest, k)
	e := k
	for e < len(rest) && !isBlank(rest[e]) {
		e++
	}
	if e == k {
		return "missing value"
	}
	v, ok := parseValue(rest[k:e])
	if !ok {
		return "invalid value"
	}
	if msg := trailer(rest[e:]); msg != "" {
		return msg
	}
	var h uint64
	if p.cm.hashed[id] { // only slots look for repeated series
		h = seriesHash(p.pairs)
	}
	for _, t := range p.cm.names[id] {
		p.observe(t, v, h)
	}
	return ""
}

func skipBlanks(b []byte, k int) int {
	for k < len(b) && isBlank(b[k]) {
		k++
	}
	return k
}

// parseValue parses a sample value as expfmt does: strconv.ParseFloat
// without the hexadecimal floats ("0x1p3") and digit separators ("1_000")
// that the text format does not have.
func parseValue(tok []byte) (float64, bool) {
	for _, c := range tok {
		if c == 'p' || c == 'P' || c == '_' {
			return 0, false
		}
	}
	v, err := strconv.ParseFloat(string(tok), 64)
	return v, err == nil
}

// trailer checks what follows a sample's value: blanks, then optionally a
// timestamp (integer milliseconds in the text format, decimal seconds in
// OpenMetrics), then optionally an OpenMetrics exemplar ("# {labels} value
// ..."), whose contents are not checked.
func trailer(t []byte) string {
	k := skipBlanks(t, 0)
	if k == len(t) {
		return ""
	}
	if t[k] != '#' {
		e := k
		for e < len(t) && !isBlank(t[e]) {
			e++
		}
		if !isTimestamp(t[k:e]) {
			return "invalid timestamp after value"
		}
		if k = skipBlanks(t, e); k == len(t) {
			return ""
		}
		if t[k] != '#' {
			return "unexpected text after timestamp"
		}
	}
	if k = skipBlanks(t, k+1); k == len(t) || t[k] != '{' {
		return "unexpected text after value"
	}
	return ""
}

// isTimestamp reports whether b is a decimal number:
// [sign] (digits [. digits] | . digits) [e [sign] digits].
func isTimestamp(b []byte) bool {
	i := 0
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		i++
	}
	digits := func() int {
		s := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i - s
	}
	n := digits()
	if i < len(b) && b[i] == '.' {
		i++
		n += digits()
	}
	if n == 0 {
		return false
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(b)
}

// sortPairs sorts a label set by name in place, without allocating, and
// reports whether its names are distinct. Label sets are small and usually
// already sorted: an insertion sort, which finds repeats on the way, costs
// one comparison per label then.
func sortPairs(ps []labelPair) bool {
	if len(ps) > 16 {
		slices.SortFunc(ps, func(a, b labelPair) int { return bytes.Compare(a.name, b.name) })
		for i := 1; i < len(ps); i++ {
			if bytes.Equal(ps[i].name, ps[i-1].name) {
				return false
			}
		}
		return true
	}
	for i := 1; i < len(ps); i++ {
		for j := i; j > 0; j-- {
			c := bytes.Compare(ps[j-1].name, ps[j].name)
			if c == 0 {
				return false
			}
			if c < 0 {
				break
			}
			ps[j-1], ps[j] = ps[j], ps[j-1]
		}
	}
	return true
}

// seriesHash identifies a series by its label set, given sorted by name
// (sortPairs), so that the order labels are written in does not matter. A
// label with an empty value is left out: Prometheus treats it as absent.
// Each pair is hashed as the lengths of its name and value, then the name,
// then the value, so that distinct label sets are distinct inputs
// (`a="x,b=y"` is not `a="x",b="y"`).
func seriesHash(ps []labelPair) uint64 {
	h := uint64(hashSeed)
	for _, lp := range ps {
		if len(lp.value) == 0 {
			continue
		}
		h = mix(h, uint64(len(lp.name))<<32|uint64(uint32(len(lp.value))))
		h = mixBytes(mixBytes(h, lp.name), lp.value)
	}
	return h
}

// unescape decodes the text format's label-value escapes (\\, \", \n, the
// only ones sample lets through) into the parser's scratch buffer, which
// sample sized so that it never grows within a line: earlier label values
// stay valid.
func (p *Parser) unescape(raw []byte) []byte {
	s := len(p.scratch)
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c == '\\' && i+1 < len(raw) {
			i++
			c = raw[i]
			if c == 'n' {
				c = '\n'
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
			// The first pair present decides, and half a pair is no pair.
			if h.Known && q.Known {
				pg.PrefixCacheHits, pg.PrefixCacheQueries = h, q
			}
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
