package rules

import (
	"fmt"
	"strings"
)

// Error is one fault in a rule file, with its place.
type Error struct {
	File   string
	Line   int // 1-based; 0 when unknown
	Column int
	Field  string // the path to the field, such as rules[1].rate
	Msg    string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteByte(':')
	}
	if e.Line > 0 && e.Column > 0 {
		fmt.Fprintf(&b, "%d:%d:", e.Line, e.Column)
	} else if e.Line > 0 { // a line without a column (a fault found after parsing)
		fmt.Fprintf(&b, "%d:", e.Line)
	}
	if b.Len() > 0 {
		b.WriteByte(' ')
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every fault found in a rule file, in file order.
type Errors []*Error

func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}
