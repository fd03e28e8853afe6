package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// exactNames checks the member names of a request body against the struct
// type it decodes into, at every level: each must be a field's name as
// written (encoding/json also takes "COST" for "cost") and given once
// (encoding/json keeps the last of two). Two decoders could otherwise read
// one body two ways: a proxy that checks "cost" and sluice that reads
// "Cost", or each taking another of two "cost" members. Maps decode their
// own members (Names refuses repeats). A body that is not valid JSON passes:
// the decoder says what is wrong with it.
func exactNames(body []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	err := checkNames(dec, t, "")
	if _, named := err.(nameError); !named {
		return nil
	}
	return err
}

// A nameError is a member name refused by exactNames; any other error of
// the walk is the body's syntax, left to the decoder.
type nameError struct {
	field, msg string
}

func (e nameError) Error() string { return e.field + ": " + e.msg }

func checkNames(dec *json.Decoder, t reflect.Type, at string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Struct && !reflect.PointerTo(t).Implements(unmarshaler):
		return checkObject(dec, structFields(t), at)
	case t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8:
		tok, err := dec.Token()
		if err != nil || tok != json.Delim('[') {
			return skipRest(dec, tok, err)
		}
		for dec.More() {
			if err := checkNames(dec, t.Elem(), at); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		return err
	}
	return skipValue(dec)
}

func checkObject(dec *json.Decoder, fields map[string]reflect.StructField, at string) error {
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return skipRest(dec, tok, err)
	}
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name := tok.(string)
		path := name
		if at != "" {
			path = at + "." + name
		}
		f, ok := fields[name]
		if !ok {
			for exact := range fields {
				if strings.EqualFold(exact, name) {
					return nameError{path, fmt.Sprintf("unknown field (names are case-sensitive: %q)", exact)}
				}
			}
			if err := skipValue(dec); err != nil { // unknown: the decoder refuses it
				return err
			}
			continue
		}
		if seen[name] {
			return nameError{path, "given twice: decoders differ on which one they read"}
		}
		seen[name] = true
		if err := checkNames(dec, f.Type, path); err != nil {
			return err
		}
	}
	_, err = dec.Token()
	return err
}

// skipValue reads one value, whatever it holds.
func skipValue(dec *json.Decoder) error {
	tok, err := dec.Token()
	return skipRest(dec, tok, err)
}

// skipRest reads the rest of a value whose first token was tok.
func skipRest(dec *json.Decoder, tok json.Token, err error) error {
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || (d != '{' && d != '[') {
		return nil
	}
	for depth := 1; depth > 0; {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
	return nil
}

var (
	unmarshaler = reflect.TypeFor[json.Unmarshaler]()
	fieldsOf    sync.Map // reflect.Type → map[string]reflect.StructField
)

// structFields are a struct type's JSON member names, as its tags (or
// field names) write them.
func structFields(t reflect.Type) map[string]reflect.StructField {
	if m, ok := fieldsOf.Load(t); ok {
		return m.(map[string]reflect.StructField)
	}
	m := map[string]reflect.StructField{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		m[name] = f
	}
	fieldsOf.Store(t, m)
	return m
}
