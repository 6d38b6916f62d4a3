package plot

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
)

// Series is one line of a chart: points (X[i], Y[i]) joined in order.
type Series struct {
	// Name labels the line in the legend.
	Name string
	// X and Y are the points; they must have equal lengths. Points with a
	// non-finite coordinate, or a non-positive one on a log axis, are
	// skipped (the line is broken there).
	X, Y []float64
	// Color is the line's colour; the zero value takes the next colour of
	// the palette.
	Color color.RGBA
}

// Chart is a line chart with labelled axes, ticks, a title and a legend.
// The zero value of every optional field is a sensible default.
type Chart struct {
	// Title is printed above the plot area.
	Title string
	// XLabel and YLabel name the axes.
	XLabel, YLabel string
	// LogX and LogY use base-10 logarithmic axes.
	LogX, LogY bool
	// XMin, XMax, YMin, YMax fix the axis ranges when Min < Max; otherwise
	// the range covers the data.
	XMin, XMax, YMin, YMax float64
	// Width and Height are the image size in pixels; 0 means 1000 × 640.
	Width, Height int
	// Series are the lines, drawn in order, listed in the legend in order.
	Series []Series
	// LegendBottomRight puts the legend in the plot area's bottom-right
	// corner instead of its top-left one (the empty corner of a CDF).
	LegendBottomRight bool
}

// Palette is the colour cycle given to series without a colour: the
// qualitative "Tableau 10" palette (Tableau Software, 2016), designed so
// that neighbouring colours stay distinguishable, plus two darker tones.
var Palette = []color.RGBA{
	{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255},
	{188, 189, 34, 255}, {23, 190, 207, 255}, {0, 0, 0, 255}, {120, 60, 0, 255},
}

// ErrNoData is returned by Render when no series has a drawable point.
var ErrNoData = errors.New("plot: no data to draw")

const (
	scale     = 2 // font pixel size in image pixels
	marginL   = 110
	marginR   = 30
	marginT   = 60
	marginB   = 80
	lineWidth = 2
)

var (
	white = color.RGBA{255, 255, 255, 255}
	black = color.RGBA{0, 0, 0, 255}
	grid  = color.RGBA{225, 225, 225, 255}
)

// axis maps data values to pixels along one dimension.
type axis struct {
	log      bool
	lo, hi   float64 // in data units (transformed by log10 when log)
	p0, p1   int     // pixel positions of lo and hi
	explicit bool
}

func (a *axis) tr(v float64) (float64, bool) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	if a.log {
		if v <= 0 {
			return 0, false
		}
		return math.Log10(v), true
	}
	return v, true
}

func (a *axis) pix(t float64) float64 {
	return float64(a.p0) + (t-a.lo)/(a.hi-a.lo)*float64(a.p1-a.p0)
}

// Render draws the chart. It returns ErrNoData when there is nothing to
// draw and an error when a series' X and Y lengths differ.
func (c *Chart) Render() (*image.RGBA, error) {
	w, h := c.Width, c.Height
	if w <= 0 || h <= 0 {
		w, h = 1000, 640
	}
	xa := &axis{log: c.LogX}
	ya := &axis{log: c.LogY}
	if err := c.ranges(xa, ya); err != nil {
		return nil, err
	}
	xa.p0, xa.p1 = marginL, w-marginR
	ya.p0, ya.p1 = h-marginB, marginT

	img := image.NewRGBA(image.Rect(0, 0, w, h))
	fill(img, img.Bounds(), white)

	// Grid and ticks.
	for _, t := range ticks(xa) {
		x := int(math.Round(xa.pix(t)))
		vline(img, x, ya.p1, ya.p0, grid)
		vline(img, x, ya.p0, ya.p0+6, black)
		lbl := tickLabel(t, xa.log)
		drawText(img, x-textWidth(lbl)/2, ya.p0+12, lbl, black)
	}
	for _, t := range ticks(ya) {
		y := int(math.Round(ya.pix(t)))
		hline(img, xa.p0, xa.p1, y, grid)
		hline(img, xa.p0-6, xa.p0, y, black)
		lbl := tickLabel(t, ya.log)
		drawText(img, xa.p0-10-textWidth(lbl), y-glyphH*scale/2, lbl, black)
	}
	// Frame.
	hline(img, xa.p0, xa.p1, ya.p0, black)
	hline(img, xa.p0, xa.p1, ya.p1, black)
	vline(img, xa.p0, ya.p1, ya.p0, black)
	vline(img, xa.p1, ya.p1, ya.p0, black)

	// Series, clipped to the plot area.
	clip := image.Rect(xa.p0+1, ya.p1+1, xa.p1, ya.p0)
	for i := range c.Series {
		s := &c.Series[i]
		col := seriesColor(s, i)
		havePrev := false
		var px, py float64
		for k := range s.X {
			tx, ok1 := xa.tr(s.X[k])
			ty, ok2 := ya.tr(s.Y[k])
			if !ok1 || !ok2 {
				havePrev = false
				continue
			}
			x, y := xa.pix(tx), ya.pix(ty)
			if havePrev {
				line(img, clip, px, py, x, y, col)
			} else {
				dot(img, clip, x, y, col)
			}
			px, py, havePrev = x, y, true
		}
	}

	// Title and axis labels.
	drawText(img, (w-textWidth(c.Title))/2, 18, c.Title, black)
	drawText(img, (xa.p0+xa.p1-textWidth(c.XLabel))/2, h-marginB+44, c.XLabel, black)
	drawTextVertical(img, 14, (ya.p0+ya.p1+textWidth(c.YLabel))/2, c.YLabel, black)

	c.legend(img, xa, ya)
	return img, nil
}

// ranges sets the axes' data ranges from the chart's limits or the data.
func (c *Chart) ranges(xa, ya *axis) error {
	xlo, xhi := math.Inf(1), math.Inf(-1)
	ylo, yhi := math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("plot: series %q has %d x and %d y values", s.Name, len(s.X), len(s.Y))
		}
		for k := range s.X {
			tx, ok1 := xa.tr(s.X[k])
			ty, ok2 := ya.tr(s.Y[k])
			if !ok1 || !ok2 {
				continue
			}
			xlo, xhi = min(xlo, tx), max(xhi, tx)
			ylo, yhi = min(ylo, ty), max(yhi, ty)
		}
	}
	if math.IsInf(xlo, 1) {
		return ErrNoData
	}
	set := func(a *axis, lo, hi, fixLo, fixHi float64) {
		if fixLo < fixHi {
			l, ok1 := a.tr(fixLo)
			u, ok2 := a.tr(fixHi)
			if ok1 && ok2 {
				a.lo, a.hi, a.explicit = l, u, true
				return
			}
		}
		if hi <= lo {
			lo, hi = lo-0.5, hi+0.5
		}
		if a.log {
			lo, hi = math.Floor(lo), math.Ceil(hi)
			if hi == lo {
				hi++
			}
		} else {
			pad := (hi - lo) * 0.03
			lo, hi = lo-pad, hi+pad
		}
		a.lo, a.hi = lo, hi
	}
	set(xa, xlo, xhi, c.XMin, c.XMax)
	set(ya, ylo, yhi, c.YMin, c.YMax)
	return nil
}

// ticks returns tick positions in transformed units: decades on a log
// axis, a 1-2-5 step giving 4 to 10 ticks on a linear one.
func ticks(a *axis) []float64 {
	var out []float64
	if a.log {
		for e := math.Ceil(a.lo); e <= a.hi+1e-9; e++ {
			out = append(out, e)
		}
		return out
	}
	span := a.hi - a.lo
	raw := span / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	for t := math.Ceil(a.lo/step) * step; t <= a.hi+step*1e-9; t += step {
		if math.Abs(t) < step*1e-9 {
			t = 0
		}
		out = append(out, t)
		if t+step == t {
			// The step is below the resolution of float64 at t (an
			// axis a few units in the last place wide): t would never
			// advance.
			break
		}
	}
	return out
}

// tickLabel formats a tick value (transformed units) for display.
func tickLabel(t float64, log bool) string {
	v := t
	if log {
		v = math.Pow(10, t)
	}
	return FormatNumber(v)
}

// FormatNumber formats v compactly: at most four significant digits, no
// exponent between 0.001 and 1e6.
func FormatNumber(v float64) string {
	if v == 0 {
		return "0"
	}
	a := math.Abs(v)
	if a >= 1e6 || a < 1e-3 {
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	s := strconv.FormatFloat(v, 'f', 4, 64)
	for len(s) > 1 && s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	if s[len(s)-1] == '.' {
		s = s[:len(s)-1]
	}
	return s
}

func seriesColor(s *Series, i int) color.RGBA {
	if s.Color.A != 0 {
		return s.Color
	}
	return Palette[i%len(Palette)]
}

// legend draws the series names with their colours in a box at the plot
// area's top left.
func (c *Chart) legend(img *image.RGBA, xa, ya *axis) {
	if len(c.Series) == 0 {
		return
	}
	widest := 0
	for _, s := range c.Series {
		widest = max(widest, textWidth(s.Name))
	}
	rowH := glyphH*scale + 8
	bw, bh := widest+50, len(c.Series)*rowH+8
	x0, y0 := xa.p0+12, ya.p1+12
	if c.LegendBottomRight {
		x0, y0 = xa.p1-12-bw, ya.p0-12-bh
	}
	box := image.Rect(x0, y0, x0+bw, y0+bh)
	fill(img, box, white)
	hline(img, box.Min.X, box.Max.X, box.Min.Y, black)
	hline(img, box.Min.X, box.Max.X, box.Max.Y, black)
	vline(img, box.Min.X, box.Min.Y, box.Max.Y, black)
	vline(img, box.Max.X, box.Min.Y, box.Max.Y, black)
	for i := range c.Series {
		s := &c.Series[i]
		y := y0 + 6 + i*rowH
		col := seriesColor(s, i)
		fill(img, image.Rect(x0+8, y+glyphH*scale/2-2, x0+36, y+glyphH*scale/2+2), col)
		drawText(img, x0+42, y, s.Name, black)
	}
}

// WritePNG renders the chart and writes it to w as a PNG.
func (c *Chart) WritePNG(w io.Writer) error {
	img, err := c.Render()
	if err != nil {
		return err
	}
	return png.Encode(w, img)
}

// SavePNG renders the chart into the file path (created or truncated).
func (c *Chart) SavePNG(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := c.WritePNG(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// CDF returns the empirical cumulative distribution of values as a series:
// the i-th smallest value v_i at fraction (i+1)/n, as a step-free line
// through those points. values is not modified.
func CDF(name string, values []float64) Series {
	v := slices.Clone(values)
	slices.Sort(v)
	s := Series{Name: name, X: v, Y: make([]float64, len(v))}
	for i := range v {
		s.Y[i] = float64(i+1) / float64(len(v))
	}
	return s
}

// Binned returns a series of an aggregate of y over bins of width along
// x: for each bin holding points, the point (bin middle, agg(ys in bin)).
// xs and ys must have equal lengths; agg receives a sorted slice it may
// keep. Bins without points are left out (the line joins their
// neighbours), and so are points whose x is not finite.
func Binned(name string, xs, ys []float64, width float64, agg func(sorted []float64) float64) Series {
	s := Series{Name: name}
	if len(xs) == 0 || len(xs) != len(ys) || !(width > 0) {
		return s
	}
	bins := map[float64][]float64{}
	var keys []float64
	for i, x := range xs {
		b := math.Floor(x / width)
		if math.IsNaN(b) || math.IsInf(b, 0) {
			continue
		}
		if _, ok := bins[b]; !ok {
			keys = append(keys, b)
		}
		bins[b] = append(bins[b], ys[i])
	}
	// Only the bins holding points are visited, in order: two points far
	// apart do not make a walk over every empty bin between them.
	slices.Sort(keys)
	for _, b := range keys {
		v := bins[b]
		slices.Sort(v)
		s.X = append(s.X, (b+0.5)*width)
		s.Y = append(s.Y, agg(v))
	}
	return s
}

// Quantile returns an aggregate for Binned: the nearest-rank q-quantile
// (0 < q ≤ 1) of a sorted slice.
func Quantile(q float64) func(sorted []float64) float64 {
	return func(v []float64) float64 {
		if len(v) == 0 {
			return math.NaN()
		}
		// ⌈q × n⌉, with q × n rounded first when it is within
		// floating-point error of a whole number (0.035 × 200 is
		// 7.000000000000001 in float64, whose ceiling is 8).
		x := q * float64(len(v))
		if r := math.Round(x); math.Abs(x-r) <= 1e-9*r {
			x = r
		}
		return v[min(max(int(math.Ceil(x)), 1), len(v))-1]
	}
}

// Mean is an aggregate for Binned: the arithmetic mean.
func Mean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}
