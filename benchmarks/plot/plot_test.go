package plot

import (
	"bytes"
	"image/color"
	"image/png"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCDF(t *testing.T) {
	in := []float64{3, 1, 2, 4}
	s := CDF("x", in)
	assert.Equal(t, []float64{1, 2, 3, 4}, s.X)
	assert.Equal(t, []float64{0.25, 0.5, 0.75, 1}, s.Y)
	assert.Equal(t, []float64{3, 1, 2, 4}, in, "input not modified")
}

func TestBinned(t *testing.T) {
	xs := []float64{0.1, 0.5, 0.9, 2.2, 2.4}
	ys := []float64{1, 3, 2, 10, 20}
	s := Binned("b", xs, ys, 1, Quantile(1))
	// Bins [0,1) → max 3 at 0.5; [2,3) → max 20 at 2.5; bin 1 empty.
	assert.Equal(t, []float64{0.5, 2.5}, s.X)
	assert.Equal(t, []float64{3, 20}, s.Y)
	m := Binned("m", xs, ys, 1, Mean)
	assert.Equal(t, []float64{2, 15}, m.Y)
	assert.Empty(t, Binned("e", nil, nil, 1, Mean).X)
}

func TestQuantile(t *testing.T) {
	v := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	assert.Equal(t, 10.0, Quantile(0.99)(v))
	assert.Equal(t, 5.0, Quantile(0.5)(v))
	assert.Equal(t, 1.0, Quantile(0.01)(v))
}

func TestFormatNumber(t *testing.T) {
	tests := []struct {
		v    float64
		want string
	}{
		{0, "0"}, {1, "1"}, {0.1, "0.1"}, {0.01, "0.01"}, {1000, "1000"}, {2.5, "2.5"},
		{0.0001, "0.0001"}, {1e7, "1e+07"}, {-3, "-3"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) { assert.Equal(t, tt.want, FormatNumber(tt.v)) })
	}
}

func TestTicks(t *testing.T) {
	assert.Equal(t, []float64{-2, -1, 0, 1}, ticks(&axis{log: true, lo: -2, hi: 1}))
	assert.Equal(t, []float64{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}, ticks(&axis{lo: 0, hi: 1}))
	assert.Equal(t, []float64{0, 20, 40, 60, 80, 100}, ticks(&axis{lo: -3, hi: 103}))
}

func TestRenderErrors(t *testing.T) {
	_, err := (&Chart{}).Render()
	require.ErrorIs(t, err, ErrNoData)
	_, err = (&Chart{LogX: true, Series: []Series{{X: []float64{0, -1}, Y: []float64{1, 2}}}}).Render()
	require.ErrorIs(t, err, ErrNoData, "non-positive values are not drawable on a log axis")
	_, err = (&Chart{Series: []Series{{Name: "bad", X: []float64{1}, Y: nil}}}).Render()
	require.ErrorContains(t, err, `series "bad" has 1 x and 0 y values`)
}

func TestRenderDrawsLinesWhereTheDataIs(t *testing.T) {
	red := color.RGBA{200, 0, 0, 255}
	c := &Chart{
		Width: 400, Height: 300, XMin: 0, XMax: 10, YMin: 0, YMax: 10,
		Series: []Series{{Name: "flat", X: []float64{0, 10}, Y: []float64{5, 5}, Color: red}},
	}
	img, err := c.Render()
	require.NoError(t, err)
	assert.Equal(t, 400, img.Bounds().Dx())
	assert.Equal(t, 300, img.Bounds().Dy())
	// Plot area: x from marginL=110 to 400−30=370; y from 300−80=220 up to
	// 60. y = 5 is the middle row 140; x = 5 the middle column 240.
	assert.Equal(t, red, img.RGBAAt(240, 140))
	assert.NotEqual(t, red, img.RGBAAt(240, 100), "nothing drawn away from the line")
	// The frame's corner is black.
	assert.Equal(t, black, img.RGBAAt(110, 220))
}

func TestWritePNGDeterministic(t *testing.T) {
	c := &Chart{Title: "T", XLabel: "x", YLabel: "y", LogY: true,
		Series: []Series{CDF("a", []float64{1, 2, 3}), {Name: "b", X: []float64{1, 2}, Y: []float64{0.5, 0.7}}}}
	var a, b bytes.Buffer
	require.NoError(t, c.WritePNG(&a))
	require.NoError(t, c.WritePNG(&b))
	assert.Equal(t, a.Bytes(), b.Bytes())
	img, err := png.Decode(&a)
	require.NoError(t, err)
	assert.Equal(t, 1000, img.Bounds().Dx())
}

func TestTextWidth(t *testing.T) {
	assert.Equal(t, 0, textWidth(""))
	assert.Equal(t, (2*advanceW-1)*scale, textWidth("ab"))
	assert.Equal(t, (advanceW-1)*scale, textWidth("×"), "runes, not bytes")
}

func TestLegendCorner(t *testing.T) {
	red := color.RGBA{200, 0, 0, 255}
	for _, br := range []bool{false, true} {
		c := &Chart{Width: 400, Height: 300, XMin: 0, XMax: 1, YMin: 0, YMax: 1, LegendBottomRight: br,
			Series: []Series{{Name: "a", X: []float64{2}, Y: []float64{2}, Color: red}}}
		img, err := c.Render()
		require.NoError(t, err)
		// The legend swatch is drawn 8..36 px right of the box's left edge,
		// in the middle of the first row.
		bw := textWidth("a") + 50
		x0, y0 := 110+12, 60+12
		if br {
			x0, y0 = 370-12-bw, 220-12-(glyphH*scale+8+8)
		}
		assert.Equal(t, red, img.RGBAAt(x0+20, y0+6+glyphH*scale/2), "bottom-right %v", br)
	}
}
