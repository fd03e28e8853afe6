package sim

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Report is a scenario's outcome: a table for people and CSV, and a value for
// JSON.
type Report struct {
	Title   string
	Columns []string
	Rows    [][]string
	Notes   []string
	JSON    any
	// Chart says how "svg" draws the table (nil: bars of every numeric
	// column per row).
	Chart *Chart
}

// Formats lists the output formats Write accepts.
var Formats = []string{"table", "json", "csv", "svg"}

// Write writes r to w as "table", "json" or "csv".
func (r *Report) Write(w io.Writer, format string) error {
	switch format {
	case "table":
		fmt.Fprintf(w, "%s\n\n", r.Title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, strings.Join(r.Columns, "\t")+"\t")
		for _, row := range r.Rows {
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, n := range r.Notes {
			fmt.Fprintf(w, "\n%s", n)
		}
		if len(r.Notes) > 0 {
			fmt.Fprintln(w)
		}
		return nil
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r.JSON)
	case "svg":
		return r.writeSVG(w)
	case "csv":
		cw := csv.NewWriter(w)
		if err := cw.Write(r.Columns); err != nil {
			return err
		}
		if err := cw.WriteAll(r.Rows); err != nil {
			return err
		}
		return cw.Error()
	}
	return fmt.Errorf("sim: unknown format %q (want one of %s)", format, strings.Join(Formats, ", "))
}
