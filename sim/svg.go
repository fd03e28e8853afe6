package sim

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// Chart says how a report is drawn as SVG: Lines over the X column (a
// time, such as the second), or by default bars, one group per row and one
// bar per Y column. Y lists the columns drawn (default: every numeric
// column after the first); cells reading "allowed" and "rejected" count as
// 1 and 0, so a table of answers draws too.
type Chart struct {
	Lines  bool
	X      string
	Y      []string
	YLabel string
}

// palette is colour-blind safe (Okabe and Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"}

func cellValue(s string) (float64, bool) {
	switch s {
	case "allowed":
		return 1, true
	case "rejected":
		return 0, true
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	return v, err == nil
}

// column returns the index of name, or -1.
func (r *Report) column(name string) int {
	for i, c := range r.Columns {
		if c == name {
			return i
		}
	}
	return -1
}

// numeric reports whether every cell of column i has a value.
func (r *Report) numeric(i int) bool {
	for _, row := range r.Rows {
		if _, ok := cellValue(row[i]); !ok {
			return false
		}
	}
	return len(r.Rows) > 0
}

// writeSVG draws r (see Chart) as a self-contained SVG document: no script,
// no external reference, text escaped.
func (r *Report) writeSVG(w io.Writer) error {
	ch := r.Chart
	if ch == nil {
		ch = &Chart{}
	}
	var ys []int
	for _, name := range ch.Y {
		if i := r.column(name); i >= 0 && r.numeric(i) {
			ys = append(ys, i)
		} else {
			return fmt.Errorf("sim: chart column %q is not a numeric column of %q", name, r.Title)
		}
	}
	if len(ys) == 0 {
		for i := 1; i < len(r.Columns); i++ {
			if r.numeric(i) {
				ys = append(ys, i)
			}
		}
	}
	if len(ys) == 0 || len(r.Rows) == 0 {
		return fmt.Errorf("sim: %q has nothing to draw", r.Title)
	}
	const width, height, left, right, top, bottom = 900.0, 420.0, 64.0, 16.0, 40.0, 90.0
	plotW, plotH := width-left-right, height-top-bottom
	hi := 0.0
	for _, row := range r.Rows {
		for _, i := range ys {
			v, _ := cellValue(row[i])
			hi = max(hi, v)
		}
	}
	hi = niceCeil(hi)
	y := func(v float64) float64 { return top + plotH - v/hi*plotH }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(r.Title))
	// The y axis: five ticks from 0 to hi.
	for k := 0; k <= 5; k++ {
		v := hi * float64(k) / 5
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", left, left+plotW, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", left-6, y(v)+4, strconv.FormatFloat(v, 'g', 4, 64))
	}
	if ch.YLabel != "" {
		fmt.Fprintf(&b, `<text transform="translate(14 %.0f) rotate(-90)" text-anchor="middle" fill="#555">%s</text>`+"\n", top+plotH/2, html.EscapeString(ch.YLabel))
	}
	if ch.Lines {
		xi := r.column(ch.X)
		if xi < 0 || !r.numeric(xi) {
			return fmt.Errorf("sim: chart x column %q is not a numeric column of %q", ch.X, r.Title)
		}
		lo, xhi := math.Inf(1), math.Inf(-1)
		for _, row := range r.Rows {
			v, _ := cellValue(row[xi])
			lo, xhi = min(lo, v), max(xhi, v)
		}
		x := func(v float64) float64 {
			if xhi == lo {
				return left
			}
			return left + (v-lo)/(xhi-lo)*plotW
		}
		for k := 0; k <= 5; k++ {
			v := lo + (xhi-lo)*float64(k)/5
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", x(v), top+plotH+16, strconv.FormatFloat(v, 'g', 4, 64))
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", left+plotW/2, top+plotH+34, html.EscapeString(ch.X))
		for s, i := range ys {
			pts := make([]string, 0, len(r.Rows))
			for _, row := range r.Rows {
				xv, _ := cellValue(row[xi])
				yv, _ := cellValue(row[i])
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(xv), y(yv)))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"><title>%s</title></polyline>`+"\n", palette[s%len(palette)], strings.Join(pts, " "), html.EscapeString(r.Columns[i]))
		}
	} else {
		group := plotW / float64(len(r.Rows))
		bar := group * 0.8 / float64(len(ys))
		for g, row := range r.Rows {
			x0 := left + float64(g)*group + group*0.1
			for s, i := range ys {
				v, _ := cellValue(row[i])
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
					x0+float64(s)*bar, y(v), max(bar-1, 0.5), top+plotH-y(v), palette[s%len(palette)],
					html.EscapeString(row[0]), html.EscapeString(r.Columns[i]), html.EscapeString(row[i]))
			}
			if len(r.Rows) <= 24 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", x0+group*0.4, top+plotH+16, html.EscapeString(rowLabel(r, row, ys)))
			}
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", left+plotW/2, top+plotH+34, html.EscapeString(r.Columns[0]))
	}
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, left+plotW, top+plotH, top+plotH)
	// The legend, under the axis, in rows as wide as the chart.
	lx, ly := left, height-38.0
	for s, i := range ys {
		wide := 24 + 7*float64(len(r.Columns[i]))
		if lx+wide > width-right && lx > left {
			lx, ly = left, ly+16
		}
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="10" height="10" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			lx, ly, palette[s%len(palette)], lx+14, ly+9, html.EscapeString(r.Columns[i]))
		lx += wide
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// rowLabel names a bar group: the row's cells that are not drawn, joined.
func rowLabel(r *Report, row []string, drawn []int) string {
	var parts []string
	for i, c := range row {
		isY := false
		for _, y := range drawn {
			isY = isY || y == i
		}
		if !isY {
			parts = append(parts, c)
		}
	}
	return strings.Join(parts, " ")
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1), so
// the axis ticks are round numbers.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}
