package gateway

// appendEscapedPath appends p escaped as url.URL.EscapedPath escapes a path
// sent raw: every byte outside printable ASCII, a space and the characters
// a path never holds unescaped as %XX, so that both planes hand the rules
// (and the upstream) the same path. A path with none of them, the usual
// case, is appended as it is.
func appendEscapedPath(b, p []byte) []byte {
	const hex = "0123456789ABCDEF"
	for _, c := range p {
		if c > 0x20 && c < 0x7f && c != '"' && c != '<' && c != '>' && c != '\\' && c != '^' && c != '`' && c != '{' && c != '|' && c != '}' {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hex[c>>4], hex[c&15])
	}
	return b
}
