package plot

import (
	"image"
	"image/color"
	"math"
)

// fill paints r (clipped to the image) with c.
func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

// hline draws a one-pixel horizontal line from x0 to x1 inclusive.
func hline(img *image.RGBA, x0, x1, y int, c color.RGBA) {
	if x1 < x0 {
		x0, x1 = x1, x0
	}
	fill(img, image.Rect(x0, y, x1+1, y+1), c)
}

// vline draws a one-pixel vertical line from y0 to y1 inclusive.
func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) {
	if y1 < y0 {
		y0, y1 = y1, y0
	}
	fill(img, image.Rect(x, y0, x+1, y1+1), c)
}

// dot paints a lineWidth-square dot centred at (x, y), clipped to clip.
func dot(img *image.RGBA, clip image.Rectangle, x, y float64, c color.RGBA) {
	ix, iy := int(math.Round(x)), int(math.Round(y))
	r := image.Rect(ix-lineWidth/2, iy-lineWidth/2, ix-lineWidth/2+lineWidth, iy-lineWidth/2+lineWidth)
	fill(img, r.Intersect(clip), c)
}

// line draws a lineWidth-thick segment by stepping one pixel at a time
// along its longer axis (the digital differential analyser), clipped to
// clip. Segments far outside the clip are clamped first so that a point
// at a huge pixel offset cannot make the loop long.
func line(img *image.RGBA, clip image.Rectangle, x0, y0, x1, y1 float64, c color.RGBA) {
	const far = 1e5
	x0, y0 = clampF(x0, -far, far), clampF(y0, -far, far)
	x1, y1 = clampF(x1, -far, far), clampF(y1, -far, far)
	dx, dy := x1-x0, y1-y0
	n := int(math.Ceil(math.Max(math.Abs(dx), math.Abs(dy))))
	if n == 0 {
		dot(img, clip, x0, y0, c)
		return
	}
	for i := 0; i <= n; i++ {
		t := float64(i) / float64(n)
		dot(img, clip, x0+t*dx, y0+t*dy, c)
	}
}

func clampF(v, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, v)) }

// textWidth returns the width in pixels of s drawn by drawText.
func textWidth(s string) int {
	n := 0
	for range s {
		n++
	}
	if n == 0 {
		return 0
	}
	return (n*advanceW - 1) * scale
}

// drawText draws s with its top-left corner at (x, y).
func drawText(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range s {
		g, ok := glyphs[r]
		if !ok {
			g = glyphs['?']
		}
		dy := 0
		if descenders[r] {
			dy = descend * scale
		}
		for row := 0; row < glyphH; row++ {
			for col := 0; col < glyphW; col++ {
				if g[row][col] == '#' {
					fill(img, image.Rect(x+col*scale, y+dy+row*scale, x+(col+1)*scale, y+dy+(row+1)*scale), c)
				}
			}
		}
		x += advanceW * scale
	}
}

// drawTextVertical draws s rotated a quarter turn counter-clockwise (read
// bottom to top), its baseline start at (x, y): for y-axis labels.
func drawTextVertical(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range s {
		g, ok := glyphs[r]
		if !ok {
			g = glyphs['?']
		}
		dx := 0
		if descenders[r] {
			dx = descend * scale
		}
		for row := 0; row < glyphH; row++ {
			for col := 0; col < glyphW; col++ {
				if g[row][col] == '#' {
					// (col, row) → (row, −col)
					px, py := x+dx+row*scale, y-(col+1)*scale
					fill(img, image.Rect(px, py, px+scale, py+scale), c)
				}
			}
		}
		y -= advanceW * scale
	}
}
