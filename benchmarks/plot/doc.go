// Package plot draws the benchmark's pictures as PNG files with the
// standard library only (image, image/png) and a small rasteriser of its
// own: line charts with linear or base-10 logarithmic axes, ticks, grid,
// title, axis labels and a legend, in a hand-drawn 5×7 bitmap font. It is
// enough for routebench's TTFT CDFs and TTFT-over-time charts, and it
// keeps the core module free of a plotting dependency.
//
// A Chart is a plain value: fill in Series (CDF and Binned build the usual
// ones) and call Render, WritePNG or SavePNG. Rendering is deterministic:
// equal charts give byte-identical PNGs. Nothing here is safe for
// concurrent mutation; distinct charts may be rendered concurrently.
package plot
