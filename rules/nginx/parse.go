package nginx

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// directive is one nginx directive: its name, its arguments (quotes
// removed), where it is, and its block, if it has one.
type directive struct {
	name  string
	args  []string
	file  string
	line  int
	block []*directive // nil for a simple directive
	isBlk bool
}

func (d *directive) at() string { return fmt.Sprintf("%s:%d", d.file, d.line) }

// maxIncludes bounds the files an import reads (include directives, globs
// included): a configuration that includes itself fails instead of looping.
const maxIncludes = 256

// parser reads nginx's configuration syntax: directives end with ";",
// blocks are in braces, "#" starts a comment outside quotes, arguments may
// be quoted with ' or " and escape with a backslash. include directives are
// read in place, relative to the including file's directory, globs sorted
// as nginx sorts them.
type parser struct {
	files int
}

func (p *parser) parseFile(path string) ([]*directive, error) {
	if p.files++; p.files > maxIncludes {
		return nil, fmt.Errorf("%s: more than %d files included (does a file include itself?)", path, maxIncludes)
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return p.parse(path, string(src))
}

func (p *parser) parse(file, src string) ([]*directive, error) {
	l := &lexer{file: file, src: src, line: 1}
	ds, err := p.block(l, false)
	if err != nil {
		return nil, err
	}
	return ds, nil
}

// block reads directives up to the end of the input, or to the "}" that
// closes the block being read (nested).
func (p *parser) block(l *lexer, nested bool) ([]*directive, error) {
	var out []*directive
	var words []string
	line := 0
	for {
		tok, kind, tokLine, err := l.next()
		if err != nil {
			return nil, err
		}
		switch kind {
		case tokEOF:
			if nested {
				return nil, fmt.Errorf("%s:%d: a block is not closed: want }", l.file, l.line)
			}
			if len(words) > 0 {
				return nil, fmt.Errorf("%s:%d: %s: want ; at the end", l.file, line, words[0])
			}
			return out, nil
		case tokWord:
			if len(words) == 0 {
				line = tokLine
			}
			words = append(words, tok)
		case tokSemicolon:
			if len(words) == 0 {
				return nil, fmt.Errorf("%s:%d: an empty directive (a lone ;)", l.file, tokLine)
			}
			d := &directive{name: words[0], args: words[1:], file: l.file, line: line}
			words = nil
			if d.name == "include" {
				inc, err := p.include(d)
				if err != nil {
					return nil, err
				}
				out = append(out, inc...)
				continue
			}
			out = append(out, d)
		case tokOpen:
			if len(words) == 0 {
				return nil, fmt.Errorf("%s:%d: a block without a directive name", l.file, tokLine)
			}
			d := &directive{name: words[0], args: words[1:], file: l.file, line: line, isBlk: true}
			words = nil
			if d.block, err = p.block(l, true); err != nil {
				return nil, err
			}
			out = append(out, d)
		case tokClose:
			if !nested {
				return nil, fmt.Errorf("%s:%d: a } without its {", l.file, tokLine)
			}
			if len(words) > 0 {
				return nil, fmt.Errorf("%s:%d: %s: want ; at the end", l.file, line, words[0])
			}
			return out, nil
		}
	}
}

// include reads the files an include directive names.
func (p *parser) include(d *directive) ([]*directive, error) {
	if len(d.args) != 1 {
		return nil, fmt.Errorf("%s: include: want one file or pattern", d.at())
	}
	pattern := d.args[0]
	if !filepath.IsAbs(pattern) {
		pattern = filepath.Join(filepath.Dir(d.file), pattern)
	}
	names, err := filepath.Glob(pattern)
	if err != nil {
		return nil, fmt.Errorf("%s: include %s: %v", d.at(), d.args[0], err)
	}
	if len(names) == 0 && !strings.ContainsAny(pattern, "*?[") {
		return nil, fmt.Errorf("%s: include %s: no such file", d.at(), d.args[0])
	}
	sort.Strings(names)
	var out []*directive
	for _, name := range names {
		ds, err := p.parseFile(name)
		if err != nil {
			return nil, err
		}
		out = append(out, ds...)
	}
	return out, nil
}

type tokenKind int

const (
	tokEOF tokenKind = iota
	tokWord
	tokSemicolon
	tokOpen
	tokClose
)

type lexer struct {
	file string
	src  string
	pos  int
	line int
}

// next returns the next token and the line it starts on.
func (l *lexer) next() (string, tokenKind, int, error) {
	for l.pos < len(l.src) {
		c := l.src[l.pos]
		switch {
		case c == '\n':
			l.line++
			l.pos++
		case c == ' ' || c == '\t' || c == '\r':
			l.pos++
		case c == '#':
			for l.pos < len(l.src) && l.src[l.pos] != '\n' {
				l.pos++
			}
		case c == ';':
			l.pos++
			return ";", tokSemicolon, l.line, nil
		case c == '{':
			l.pos++
			return "{", tokOpen, l.line, nil
		case c == '}':
			l.pos++
			return "}", tokClose, l.line, nil
		case c == '"' || c == '\'':
			return l.quoted(c)
		default:
			return l.word()
		}
	}
	return "", tokEOF, l.line, nil
}

func (l *lexer) quoted(q byte) (string, tokenKind, int, error) {
	start := l.line
	l.pos++
	var b strings.Builder
	for l.pos < len(l.src) {
		c := l.src[l.pos]
		switch {
		case c == '\\' && l.pos+1 < len(l.src):
			l.pos++
			b.WriteByte(l.src[l.pos])
		case c == q:
			l.pos++
			return b.String(), tokWord, start, nil
		default:
			if c == '\n' {
				l.line++
			}
			b.WriteByte(c)
		}
		l.pos++
	}
	return "", 0, 0, fmt.Errorf("%s:%d: a quoted argument is not closed", l.file, start)
}

func (l *lexer) word() (string, tokenKind, int, error) {
	start := l.pos
	for l.pos < len(l.src) {
		c := l.src[l.pos]
		if c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ';' || c == '{' || c == '}' {
			break
		}
		if c == '$' && l.pos+1 < len(l.src) && l.src[l.pos+1] == '{' { // ${name} does not open a block
			end := strings.IndexByte(l.src[l.pos:], '}')
			if end < 0 {
				return "", 0, 0, fmt.Errorf("%s:%d: ${ without its }", l.file, l.line)
			}
			l.pos += end + 1
			continue
		}
		l.pos++
	}
	return l.src[start:l.pos], tokWord, l.line, nil
}
