package extproc

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"unicode/utf8"
)

// This file holds the JSON scanner under ParseRequest: a validating, allocation-free reader
// over the body bytes. It accepts exactly the documents encoding/json.Valid accepts (RFC 8259
// syntax, nesting up to maxNesting, any bytes >= 0x80 inside strings), so a body is rejected as
// "not valid JSON" exactly when encoding/json would reject it.

// maxNesting is encoding/json's nesting limit: a document nested deeper is invalid there too.
const maxNesting = 10000

// scanner reads one JSON document. The first syntax error is fatal (syn is set and every
// method returns false from then on); the first semantic error (a wrong type, a missing field)
// is recorded in sem and scanning goes on, so that a syntax error later in the body wins.
type scanner struct {
	b     []byte
	i     int
	depth int // nesting of the containers the caller is inside
	syn   *RequestError
	sem   *RequestError
}

// whitespace marks the four JSON whitespace bytes.
var whitespace = [256]bool{' ': true, '\t': true, '\n': true, '\r': true}

// ws skips whitespace.
func (s *scanner) ws() {
	if s.i < len(s.b) && s.b[s.i] > ' ' {
		return
	}
	s.wsLoop()
}

func (s *scanner) wsLoop() {
	for s.i < len(s.b) && whitespace[s.b[s.i]] {
		s.i++
	}
}

// peek returns the next byte, or 0 at the end of the body.
func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// fail records a syntax error at byte i (the first one wins) and returns false.
func (s *scanner) fail(i int, format string, args ...any) bool {
	if s.syn == nil {
		s.syn = invalid(fmt.Sprintf("body is not valid JSON: "+format+" at byte %d", append(args, i)...))
	}
	return false
}

// unexpected fails on the byte at i (or on the end of the body).
func (s *scanner) unexpected(i int) bool {
	if i >= len(s.b) {
		return s.fail(i, "unexpected end of body")
	}
	return s.fail(i, "unexpected %s", quoteByte(s.b[i]))
}

// semantic records a semantic error (the first one wins).
func (s *scanner) semantic(msg string) {
	if s.sem == nil {
		s.sem = invalid(msg)
	}
}

// quoteByte shows one byte in a message: 'x' when printable ASCII, else its hex value.
func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("'%c'", c)
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

// expect consumes byte c after optional whitespace.
func (s *scanner) expect(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return s.unexpected(s.i)
}

// push enters one container level.
func (s *scanner) push() bool {
	if s.depth >= maxNesting {
		return s.fail(s.i, "nesting deeper than %d levels", maxNesting)
	}
	s.depth++
	return true
}

// SWAR constants: a word with every byte set to 0x01, 0x80, '"', '\\' and 0x20.
const (
	lo8    = 0x0101010101010101
	hi8    = 0x8080808080808080
	quote8 = 0x2222222222222222
	bslsh8 = 0x5c5c5c5c5c5c5c5c
	space8 = 0x2020202020202020
)

// specialMask flags (bit 7 of the byte) the bytes of w that may be '"', '\\' or a control byte
// (< 0x20). Bytes >= 0x80 are never flagged, and the lowest flagged byte is always a true one
// (a borrow can only flag bytes above a true one), so it locates the first special byte.
func specialMask(w uint64) uint64 {
	q := w ^ quote8
	b := w ^ bslsh8
	return ((q-lo8)&^q | (b-lo8)&^b | (w-space8)&^w) & hi8
}

// plainRun returns the end of the run of ordinary string bytes starting at i: the index of the
// first '"', '\\' or control byte, or len(b).
func plainRun(b []byte, i int) int {
	for i+8 <= len(b) {
		if m := specialMask(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
		i += 8
	}
	for i < len(b) {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 {
			break
		}
		i++
	}
	return i
}

// str scans the string starting at the opening quote at s.i, leaving s.i after the closing
// quote. It returns whether the string holds escapes.
func (s *scanner) str() (esc, ok bool) {
	b := s.b
	i := s.i + 1
	for {
		i = plainRun(b, i)
		if i >= len(b) {
			return esc, s.fail(i, "unexpected end of body")
		}
		switch c := b[i]; {
		case c == '"':
			s.i = i + 1
			return esc, true
		case c == '\\':
			esc = true
			n, ok := s.escapeLen(i)
			if !ok {
				return esc, false
			}
			i += n
		default:
			return esc, s.fail(i, "control character 0x%02x in string", c)
		}
	}
}

// escapeLen validates the escape sequence at b[i] == '\\' and returns its length.
func (s *scanner) escapeLen(i int) (int, bool) {
	b := s.b
	if i+1 >= len(b) {
		return 0, s.fail(len(b), "unexpected end of body")
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, true
	case 'u':
		for k := i + 2; k < i+6; k++ {
			if k >= len(b) {
				return 0, s.fail(k, "unexpected end of body")
			}
			if unhex(b[k]) < 0 {
				return 0, s.fail(k, "invalid \\u escape in string")
			}
		}
		return 6, true
	}
	if c := b[i+1]; c < 0x20 || c >= 0x7f {
		return 0, s.fail(i, "invalid escape in string")
	}
	return 0, s.fail(i, "invalid escape '\\%c' in string", b[i+1])
}

// simpleEscape maps the byte after '\\' of a one-character escape to the byte it stands for.
var simpleEscape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func hex4(b []byte) rune {
	return rune(unhex(b[0])<<12 | unhex(b[1])<<8 | unhex(b[2])<<4 | unhex(b[3]))
}

// decodeEscape decodes the (already validated) escape at b[i] == '\\' into out, and returns the
// number of body bytes consumed and of bytes written. A \u escape of a lone surrogate decodes to
// U+FFFD, as encoding/json does; a valid surrogate pair decodes to one rune.
func decodeEscape(b []byte, i int, out *[4]byte) (consumed, n int) {
	switch b[i+1] {
	case 'b':
		out[0] = '\b'
	case 'f':
		out[0] = '\f'
	case 'n':
		out[0] = '\n'
	case 'r':
		out[0] = '\r'
	case 't':
		out[0] = '\t'
	case 'u':
		r := hex4(b[i+2 : i+6])
		consumed = 6
		if utf16IsSurrogate(r) {
			r2 := rune(-1)
			if r < 0xdc00 && i+12 <= len(b) && b[i+6] == '\\' && b[i+7] == 'u' && validHex4(b[i+8:i+12]) {
				r2 = hex4(b[i+8 : i+12])
			}
			if r2 >= 0xdc00 && r2 <= 0xdfff {
				r = 0x10000 + (r-0xd800)<<10 + (r2 - 0xdc00)
				consumed = 12
			} else {
				r = utf8.RuneError
			}
		}
		return consumed, utf8.EncodeRune(out[:], r)
	default: // '"', '\\', '/'
		out[0] = b[i+1]
	}
	return 2, 1
}

func utf16IsSurrogate(r rune) bool { return r >= 0xd800 && r <= 0xdfff }

func validHex4(b []byte) bool {
	return unhex(b[0]) >= 0 && unhex(b[1]) >= 0 && unhex(b[2]) >= 0 && unhex(b[3]) >= 0
}

// appendUnescaped appends the decoded content of the (valid) string body b, which excludes
// the quotes.
func appendUnescaped(dst, b []byte) []byte {
	var tmp [4]byte
	for i := 0; i < len(b); {
		j := i
		for j < len(b) && b[j] != '\\' {
			j++
		}
		dst = append(dst, b[i:j]...)
		if j >= len(b) {
			break
		}
		c, n := decodeEscape(b, j, &tmp)
		dst = append(dst, tmp[:n]...)
		i = j + c
	}
	return dst
}

// number scans the number starting at s.i and validates its syntax. When it is an integer
// (no fraction, no exponent) that fits in 63 bits, integer reports it with its sign.
func (s *scanner) number() (v int64, integer, ok bool) {
	b := s.b
	i := s.i
	neg := false
	if i < len(b) && b[i] == '-' {
		neg = true
		i++
	}
	if i >= len(b) {
		return 0, false, s.fail(i, "unexpected end of body")
	}
	integer = true
	switch c := b[i]; {
	case c == '0':
		i++
	case c >= '1' && c <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			d := int64(b[i] - '0')
			if v > (1<<63-1-d)/10 {
				integer = false // too large: a valid number, not a usable integer
			} else {
				v = v*10 + d
			}
			i++
		}
	default:
		return 0, false, s.unexpected(i)
	}
	if i < len(b) && b[i] == '.' {
		integer = false
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return 0, false, s.unexpected(i)
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		integer = false
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return 0, false, s.unexpected(i)
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	s.i = i
	if neg {
		v = -v
	}
	return v, integer, true
}

// literal scans true, false or null at s.i.
func (s *scanner) literal(word string) bool {
	b := s.b
	for k := 0; k < len(word); k++ {
		if s.i+k >= len(b) || b[s.i+k] != word[k] {
			return s.unexpected(s.i + k)
		}
	}
	s.i += len(word)
	return true
}

// bitstack records the kind of each open container (true = object) for skipValue; levels
// past 64 spill to the heap, which only a pathological body reaches.
type bitstack struct {
	lo uint64
	hi []uint64
	n  int
}

func (b *bitstack) push(obj bool) {
	var bit uint64
	if obj {
		bit = 1
	}
	if b.n < 64 {
		b.lo = b.lo&^(1<<b.n) | bit<<b.n
	} else {
		w, k := (b.n-64)/64, (b.n-64)%64
		for len(b.hi) <= w {
			b.hi = append(b.hi, 0)
		}
		b.hi[w] = b.hi[w]&^(1<<k) | bit<<k
	}
	b.n++
}

func (b *bitstack) top() bool {
	l := b.n - 1
	if l < 64 {
		return b.lo>>l&1 == 1
	}
	return b.hi[(l-64)/64]>>((l-64)%64)&1 == 1
}

// skipValue scans and validates any one value after optional whitespace, without recursion
// (a deeply nested body cannot exhaust the stack).
func (s *scanner) skipValue() bool {
	var st bitstack
	b := s.b
value:
	s.ws()
	if s.i >= len(b) {
		return s.unexpected(s.i)
	}
	switch c := b[s.i]; c {
	case '{', '[':
		if !s.push() {
			return false
		}
		st.push(c == '{')
		s.i++
		s.ws()
		if c == '{' {
			if s.peek() != '}' {
				goto key
			}
		} else if s.peek() != ']' {
			goto value
		}
		s.i++
		st.n--
		s.depth--
	case '"':
		if _, ok := s.str(); !ok {
			return false
		}
	case 't':
		if !s.literal("true") {
			return false
		}
	case 'f':
		if !s.literal("false") {
			return false
		}
	case 'n':
		if !s.literal("null") {
			return false
		}
	default:
		if c != '-' && (c < '0' || c > '9') {
			return s.unexpected(s.i)
		}
		if _, _, ok := s.number(); !ok {
			return false
		}
	}
closed:
	if st.n == 0 {
		return true
	}
	s.ws()
	if s.i >= len(b) {
		return s.unexpected(s.i)
	}
	switch c := b[s.i]; {
	case c == ',':
		s.i++
		if st.top() {
			goto key
		}
		goto value
	case c == '}' && st.top(), c == ']' && !st.top():
		s.i++
		st.n--
		s.depth--
		goto closed
	}
	return s.unexpected(s.i)
key:
	s.ws()
	if s.peek() != '"' {
		return s.unexpected(s.i)
	}
	if _, ok := s.str(); !ok {
		return false
	}
	if !s.expect(':') {
		return false
	}
	goto value
}

// key reads an object key at s.i (after whitespace) and the colon after it. The key's bytes are
// returned raw when it has no escapes; a key with escapes is decoded into buf when it fits
// (longer ones cannot be any key the parser looks for).
func (s *scanner) key(buf *[32]byte) ([]byte, bool) {
	s.ws()
	if s.peek() != '"' {
		return nil, s.unexpected(s.i)
	}
	start := s.i + 1
	esc, ok := s.str()
	if !ok {
		return nil, false
	}
	k := s.b[start : s.i-1]
	if esc {
		if len(k) > len(buf)*2 {
			k = nil
		} else {
			d := appendUnescaped(buf[:0], k)
			if len(d) > len(buf) {
				k = nil
			} else {
				k = d
			}
		}
	}
	if !s.expect(':') {
		return nil, false
	}
	s.ws()
	return k, true
}

// next consumes the ',' or the closing byte after a member or an element. It returns more=true
// after a ',' and more=false after the closing byte.
func (s *scanner) next(closing byte) (more, ok bool) {
	s.ws()
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case ',':
			s.i++
			return true, true
		case closing:
			s.i++
			s.depth--
			return false, true
		}
	}
	return false, s.unexpected(s.i)
}

// open consumes the opening byte of a container at s.i and reports whether it is empty (in
// which case the closing byte is consumed too).
func (s *scanner) open() (empty, ok bool) {
	closing := byte('}')
	if s.b[s.i] == '[' {
		closing = ']'
	}
	if !s.push() {
		return false, false
	}
	s.i++
	s.ws()
	if s.peek() == closing {
		s.i++
		s.depth--
		return true, true
	}
	return false, true
}

// raw returns the text of the value that spans b[start:s.i], shortened for a message.
func (s *scanner) raw(start int) string {
	v := s.b[start:s.i]
	if len(v) > 40 {
		return string(v[:37]) + "..."
	}
	return string(v)
}
