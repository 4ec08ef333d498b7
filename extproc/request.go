package extproc

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cespare/xxhash/v2"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/router"
)

// MaxPrefixBlocks is the number of prompt-prefix block hashes a Request carries at most: as
// many as the router uses.
const MaxPrefixBlocks = router.MaxPrefixBlocks

// MaxModelBytes is the longest model name accepted (decoded bytes): names are client-chosen
// keys of the sizing table and of /narwhal/state, so they are bounded.
const MaxModelBytes = 256

// MessageOverheadTokens is the chat-template cost of one message (role markers, separators),
// added to its content's size.
const MessageOverheadTokens = 4

// Rejection codes of ParseRequest (README, the rejections table).
const (
	CodeInvalidRequest = "invalid_request"
	CodeBodyTooLarge   = "body_too_large"
)

// Request holds the facts of one inference request that the router needs. It is a plain value
// with no pointers but Model, so keeping it costs no allocation beyond the model name.
type Request struct {
	Model  string
	Stream bool
	// MaxTokens is max_completion_tokens when given, else max_tokens; 0 when neither is.
	MaxTokens int
	// PromptTokens is the local size of the prompt: text tokens (estimated or counted, see
	// Sizer) plus FixedTokens.
	PromptTokens int
	// TextBytes is the decoded size of the prompt text (message contents, text parts, prompt
	// strings), the input of the bytes sizing method and of its calibration (Sizer.ObserveRequest).
	TextBytes int
	// FixedTokens is the part of PromptTokens that does not come from text: token-id prompts,
	// MessageOverheadTokens per chat message and ParseOptions.NonTextTokens per non-text part.
	FixedTokens int
	// Prefix[:PrefixBlocks] are chained 64-bit hashes of the prompt's leading full blocks
	// (ParseOptions.BlockTokens): Prefix[k] covers the first k+1 blocks, so two prompts share
	// their first n hashes exactly when they share their first n blocks (up to collisions).
	// Text is hashed as decoded bytes, 4 per token (a block is BlockTokens*4 bytes): a chat
	// prompt is each message's content followed by a marker holding its role; a non-text part
	// is a marker holding a hash of its JSON. Token ids are hashed as 4-byte little-endian
	// words (a block is BlockTokens ids). A batch prompt (array of strings or of id arrays)
	// hashes its first prompt only. The hashes do not cover the model: key by model too.
	PrefixBlocks int
	Prefix       [MaxPrefixBlocks]uint64
}

// PrefixHashes returns the prefix block hashes (a view of r.Prefix).
func (r *Request) PrefixHashes() []uint64 { return r.Prefix[:r.PrefixBlocks] }

// RequestError is a request refused by ParseRequest: an HTTP status, the OpenAI-style error
// code, and a message for the client that says what is wrong.
type RequestError struct {
	Status  int
	Code    string
	Message string
}

func (e *RequestError) Error() string { return e.Message }

func invalid(msg string) *RequestError {
	return &RequestError{Status: 400, Code: CodeInvalidRequest, Message: msg}
}

// ParseOptions configures ParseRequest.
type ParseOptions struct {
	// BodyLimit is the largest accepted body in bytes (413 above it); 0 means no limit.
	BodyLimit int64
	// BlockTokens is the prefix block size in tokens; 0 disables prefix hashing.
	BlockTokens int
	// NonTextTokens is the size of one non-text content part (an image, audio...).
	NonTextTokens int
	// Sizer sizes the prompt text. Nil sizes it by bytes at DefaultBytesPerToken.
	Sizer *Sizer
}

// NewParseOptions returns the options that the router config r asks for, sizing with s.
func NewParseOptions(r config.Router, s *Sizer) ParseOptions {
	o := ParseOptions{BodyLimit: r.BodyLimitBytes, NonTextTokens: r.Sizing.NonTextTokens, Sizer: s}
	if r.PrefixAffinity.Enabled {
		o.BlockTokens = r.PrefixAffinity.BlockTokens
	}
	return o
}

// ParseRequest reads an OpenAI completions (chat=false) or chat completions (chat=true)
// request body. It reads only model, prompt or messages, max_tokens, max_completion_tokens
// and stream; every other member is validated as JSON and skipped. It refuses a body over
// opts.BodyLimit with 413 body_too_large, and with 400 invalid_request a body that is not a
// valid JSON object, lacks model or the prompt, or holds one of the read fields with a wrong
// type or value. A syntax error anywhere wins over a type error, which wins over a missing
// field. The body is not retained; a successful parse allocates at most the model name (none
// when opts.Sizer already tracks the model).
func ParseRequest(body []byte, chat bool, opts ParseOptions) (Request, *RequestError) {
	if opts.BodyLimit > 0 && int64(len(body)) > opts.BodyLimit {
		return Request{}, &RequestError{Status: 413, Code: CodeBodyTooLarge,
			Message: fmt.Sprintf("the body is over the limit of %d bytes (router.body_limit_bytes)", opts.BodyLimit)}
	}
	p := parser{scanner: scanner{b: body}, opts: opts, chat: chat}
	if opts.BlockTokens > 0 {
		p.blockBytes = 4 * opts.BlockTokens
	}
	p.bpe = opts.Sizer != nil && opts.Sizer.codec != nil
	p.parse()
	switch {
	case p.syn != nil:
		return Request{}, p.syn
	case p.sem != nil:
		return Request{}, p.sem
	case !p.hasModel:
		return Request{}, invalid(`missing "model"`)
	case !p.hasPrompt && chat:
		return Request{}, invalid(`missing "messages"`)
	case !p.hasPrompt:
		return Request{}, invalid(`missing "prompt"`)
	}
	if n := p.modelEnd - p.modelStart; n > MaxModelBytes {
		if p.modelEsc {
			n = len(appendUnescaped(nil, p.b[p.modelStart:p.modelEnd]))
		}
		if n > MaxModelBytes {
			return Request{}, invalid(fmt.Sprintf(`"model" is %d bytes long; the limit is %d`, n, MaxModelBytes))
		}
	}
	p.finish()
	return p.req, nil
}

// tally accumulates the prompt's size and prefix hashes while it is read. It is a value, so
// that a duplicated member can be undone by restoring a copy.
type tally struct {
	textBytes int
	fixed     int
	bpe       int // text tokens counted by the BPE codec
	hashing   bool
	inBlock   int // bytes of the current block, hashed or staged
	blocks    int
	nstage    int // bytes of parser.stage not yet written to d (few large writes are faster)
	d         xxhash.Digest
}

type parser struct {
	scanner
	opts       ParseOptions
	req        Request
	chat       bool
	bpe        bool
	blockBytes int
	t          tally

	hasModel, hasPrompt  bool
	modelStart, modelEnd int
	modelEsc             bool
	maxTokens, maxCompl  int

	stage   [256]byte // text waiting to be hashed (tally.nstage bytes)
	ids     [128]byte // token ids waiting to be hashed
	nids    int
	scratch []byte // unescaped text for the BPE codec
}

func (p *parser) parse() {
	p.ws()
	if p.i >= len(p.b) {
		p.unexpected(p.i)
		return
	}
	if p.b[p.i] != '{' {
		if p.skipValue() && p.end() {
			p.semantic("body must be a JSON object")
		}
		return
	}
	empty, ok := p.open()
	if !ok {
		return
	}
	var kb [32]byte
	for more := !empty; more; {
		k, ok := p.key(&kb)
		if !ok {
			return
		}
		switch string(k) {
		case "model":
			ok = p.model()
		case "prompt":
			if p.chat {
				ok = p.skipValue()
			} else {
				ok = p.prompt()
			}
		case "messages":
			if p.chat {
				ok = p.messages()
			} else {
				ok = p.skipValue()
			}
		case "max_tokens":
			ok = p.positiveInt("max_tokens", &p.maxTokens)
		case "max_completion_tokens":
			ok = p.positiveInt("max_completion_tokens", &p.maxCompl)
		case "stream":
			ok = p.stream()
		default:
			ok = p.skipValue()
		}
		if !ok {
			return
		}
		if more, ok = p.next('}'); !ok {
			return
		}
	}
	p.end()
}

// end checks that nothing but whitespace follows the top-level value.
func (p *parser) end() bool {
	p.ws()
	if p.i < len(p.b) {
		return p.fail(p.i, "unexpected %s after the top-level value", quoteByte(p.b[p.i]))
	}
	return true
}

// finish fills the request from what was read.
func (p *parser) finish() {
	r := &p.req
	s := p.opts.Sizer
	name := p.b[p.modelStart:p.modelEnd]
	var e *modelStats
	if p.modelEsc {
		r.Model = string(appendUnescaped(nil, name))
		e = s.stats(r.Model)
	} else {
		e = s.lookup(name)
		if e != nil {
			r.Model = e.name
		} else {
			r.Model = string(name)
		}
	}
	p.flushIDs()
	r.TextBytes = p.t.textBytes
	r.FixedTokens = p.t.fixed
	if p.bpe {
		r.PromptTokens = p.t.bpe + p.t.fixed
	} else {
		r.PromptTokens = textTokens(p.t.textBytes, e.bytesPerToken()) + p.t.fixed
	}
	r.PrefixBlocks = p.t.blocks
	r.MaxTokens = p.maxTokens
	if p.maxCompl > 0 {
		r.MaxTokens = p.maxCompl
	}
}

// textTokens is the bytes method's estimate: bytes/ratio rounded, at least 1 for any text.
func textTokens(bytes int, ratio float64) int {
	if bytes <= 0 {
		return 0
	}
	return max(1, int(float64(bytes)/ratio+0.5))
}

// resetPrompt starts the prompt over (a duplicated prompt or messages member: the last wins).
func (p *parser) resetPrompt() {
	p.t = tally{hashing: p.blockBytes > 0}
	p.t.d.Reset()
	p.nids = 0
	p.hasPrompt = false
}

// hash feeds b to the prefix block hashes.
func (p *parser) hash(b []byte) {
	t := &p.t
	for t.hashing && len(b) > 0 {
		n := copy(p.stage[t.nstage:min(len(p.stage), t.nstage+p.blockBytes-t.inBlock)], b)
		t.nstage += n
		t.inBlock += n
		b = b[n:]
		if t.inBlock == p.blockBytes {
			t.d.Write(p.stage[:t.nstage])
			t.nstage = 0
			h := t.d.Sum64()
			p.req.Prefix[t.blocks] = h
			t.blocks++
			t.inBlock = 0
			t.d.ResetWithSeed(h)
			t.hashing = t.blocks < MaxPrefixBlocks
		} else if t.nstage == len(p.stage) {
			t.d.Write(p.stage[:])
			t.nstage = 0
		}
	}
}

// snapshot returns the tally, to be restored if what follows is undone. It writes out the
// staged text first, so that the copy needs no stage.
func (p *parser) snapshot() tally {
	if p.t.nstage > 0 {
		p.t.d.Write(p.stage[:p.t.nstage])
		p.t.nstage = 0
	}
	return p.t
}

// addText counts and hashes a piece of decoded prompt text.
func (p *parser) addText(b []byte) {
	p.t.textBytes += len(b)
	if p.t.hashing {
		p.hash(b)
	}
}

// addByte is addText of one byte.
func (p *parser) addByte(c byte) {
	t := &p.t
	t.textBytes++
	if t.hashing {
		if t.nstage < len(p.stage)-1 && t.inBlock < p.blockBytes-1 {
			p.stage[t.nstage] = c
			t.nstage++
			t.inBlock++
			return
		}
		p.hash([]byte{c})
	}
}

// text reads the string at p.i as prompt text and returns its decoded length.
func (p *parser) text() (int, bool) {
	b := p.b
	start := p.i + 1
	before := p.t.textBytes
	i, run := start, start
	esc := false
	var tmp [4]byte
	for {
		i = plainRun(b, i)
		if i >= len(b) {
			return 0, p.fail(i, "unexpected end of body")
		}
		c := b[i]
		if c == '"' {
			break
		}
		if c != '\\' {
			return 0, p.fail(i, "control character 0x%02x in string", c)
		}
		esc = true
		p.addText(b[run:i])
		if i+1 < len(b) && simpleEscape[b[i+1]] != 0 {
			p.addByte(simpleEscape[b[i+1]])
			i += 2
		} else {
			if _, ok := p.escapeLen(i); !ok {
				return 0, false
			}
			n, m := decodeEscape(b, i, &tmp)
			p.addText(tmp[:m])
			i += n
		}
		run = i
	}
	p.addText(b[run:i])
	p.i = i + 1
	if p.bpe {
		seg := b[start:i]
		if esc {
			p.scratch = appendUnescaped(p.scratch[:0], seg)
			seg = p.scratch
		}
		p.t.bpe += p.opts.Sizer.countBPE(seg)
	}
	return p.t.textBytes - before, true
}

func (p *parser) model() bool {
	switch p.peek() {
	case '"':
		start := p.i + 1
		esc, ok := p.str()
		if !ok {
			return false
		}
		if p.i-1 == start {
			p.semantic(`"model" must be a non-empty string`)
		}
		p.hasModel, p.modelStart, p.modelEnd, p.modelEsc = true, start, p.i-1, esc
		return true
	case 'n':
		p.hasModel = false
		return p.literal("null")
	}
	start := p.i
	if !p.skipValue() {
		return false
	}
	p.semantic(`"model" must be a non-empty string, got ` + p.raw(start))
	return true
}

func (p *parser) stream() bool {
	switch p.peek() {
	case 't':
		p.req.Stream = true
		return p.literal("true")
	case 'f':
		p.req.Stream = false
		return p.literal("false")
	case 'n':
		p.req.Stream = false
		return p.literal("null")
	}
	start := p.i
	if !p.skipValue() {
		return false
	}
	p.semantic(`"stream" must be a boolean, got ` + p.raw(start))
	return true
}

// positiveInt reads max_tokens or max_completion_tokens; null leaves it unset.
func (p *parser) positiveInt(name string, dst *int) bool {
	start := p.i
	switch c := p.peek(); {
	case c == 'n':
		*dst = 0
		return p.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		v, integer, ok := p.number()
		if !ok {
			return false
		}
		switch {
		case !integer || v <= 0:
			p.semantic(fmt.Sprintf("%q must be a positive integer, got %s", name, p.raw(start)))
		case v > math.MaxInt32:
			p.semantic(fmt.Sprintf("%q is too large: %s", name, p.raw(start)))
		default:
			*dst = int(v)
		}
		return true
	}
	if !p.skipValue() {
		return false
	}
	p.semantic(fmt.Sprintf("%q must be a positive integer, got %s", name, p.raw(start)))
	return true
}

const promptForms = `"prompt" must be a string, an array of strings, or an array of token ids`

// prompt reads the prompt of a completions request.
func (p *parser) prompt() bool {
	p.resetPrompt()
	start := p.i
	switch p.peek() {
	case 'n':
		return p.literal("null")
	case '"':
		n, ok := p.text()
		if !ok {
			return false
		}
		if n == 0 && p.i-start == 2 {
			p.semantic(`"prompt" must not be empty`)
		}
		p.hasPrompt = true
		return true
	case '[':
		p.hasPrompt = true
		return p.promptArray()
	}
	if !p.skipValue() {
		return false
	}
	p.semantic(promptForms + ", got " + p.raw(start))
	return true
}

// promptArray reads an array of strings, of token ids or of arrays of token ids.
func (p *parser) promptArray() bool {
	empty, ok := p.open()
	if !ok {
		return false
	}
	if empty {
		p.semantic(`"prompt" must not be empty`)
		return true
	}
	first := p.peek()
	for idx, more := 0, true; more; idx++ {
		p.ws()
		start := p.i
		c := p.peek()
		switch {
		case first == '"' && c == '"':
			n, ok := p.text()
			if !ok {
				return false
			}
			if n == 0 && p.i-start == 2 {
				p.semantic(fmt.Sprintf(`"prompt"[%d] must not be empty`, idx))
			}
		case isNumberStart(first):
			if !p.tokenID(idx, -1) {
				return false
			}
		case first == '[' && c == '[':
			if !p.idArray(idx) {
				return false
			}
		default:
			if !p.skipValue() {
				return false
			}
			if first == '"' || first == '[' {
				want := "a string"
				if first == '[' {
					want = "an array of token ids"
				}
				p.semantic(fmt.Sprintf(`"prompt"[%d] must be %s like "prompt"[0], got %s`, idx, want, p.raw(start)))
			} else {
				p.semantic(promptForms + fmt.Sprintf(`; "prompt"[%d] is %s`, idx, p.raw(start)))
			}
		}
		if idx == 0 && !isNumberStart(first) {
			// A batch prompt: only its first prompt is hashed.
			p.flushIDs()
			p.t.hashing = false
		}
		if more, ok = p.next(']'); !ok {
			return false
		}
	}
	return true
}

func isNumberStart(c byte) bool { return c == '-' || c >= '0' && c <= '9' }

// idArray reads "prompt"[idx], an array of token ids.
func (p *parser) idArray(idx int) bool {
	empty, ok := p.open()
	if !ok {
		return false
	}
	if empty {
		p.semantic(fmt.Sprintf(`"prompt"[%d] must not be empty`, idx))
		return true
	}
	for j, more := 0, true; more; j++ {
		p.ws()
		if !p.tokenID(idx, j) {
			return false
		}
		if more, ok = p.next(']'); !ok {
			return false
		}
	}
	return true
}

// tokenID reads one token id, "prompt"[i] (j < 0) or "prompt"[i][j].
func (p *parser) tokenID(i, j int) bool {
	start := p.i
	v, integer := int64(-1), false
	if isNumberStart(p.peek()) {
		var ok bool
		if v, integer, ok = p.number(); !ok {
			return false
		}
	} else if !p.skipValue() {
		return false
	}
	if !integer || v < 0 || v > math.MaxUint32 {
		path := fmt.Sprintf(`"prompt"[%d]`, i)
		if j >= 0 {
			path += fmt.Sprintf("[%d]", j)
		}
		p.semantic(fmt.Sprintf("%s must be a token id (an integer from 0 to %d), got %s", path, uint32(math.MaxUint32), p.raw(start)))
		return true
	}
	p.t.fixed++
	if p.t.hashing {
		binary.LittleEndian.PutUint32(p.ids[p.nids:], uint32(v))
		if p.nids += 4; p.nids == len(p.ids) {
			p.flushIDs()
		}
	}
	return true
}

func (p *parser) flushIDs() {
	if p.nids > 0 {
		p.hash(p.ids[:p.nids])
		p.nids = 0
	}
}

// messages reads the messages of a chat request.
func (p *parser) messages() bool {
	p.resetPrompt()
	start := p.i
	switch p.peek() {
	case 'n':
		return p.literal("null")
	case '[':
		p.hasPrompt = true
		empty, ok := p.open()
		if !ok {
			return false
		}
		if empty {
			p.semantic(`"messages" must not be empty`)
			return true
		}
		for idx, more := 0, true; more; idx++ {
			if !p.message(idx) {
				return false
			}
			if more, ok = p.next(']'); !ok {
				return false
			}
		}
		return true
	}
	if !p.skipValue() {
		return false
	}
	p.semantic(`"messages" must be an array of messages, got ` + p.raw(start))
	return true
}

// Content states of a message or a part.
const (
	absent = iota
	null
	present
)

var (
	roleMarker = []byte{0, 'r'}
	partMarker = []byte{0, 'p'}
)

// message reads "messages"[idx].
func (p *parser) message(idx int) bool {
	p.ws()
	start := p.i
	if p.peek() != '{' {
		if !p.skipValue() {
			return false
		}
		p.semantic(fmt.Sprintf(`"messages"[%d] must be an object, got %s`, idx, p.raw(start)))
		return true
	}
	empty, ok := p.open()
	if !ok {
		return false
	}
	roleStart, roleEnd := -1, -1
	content := absent
	var snap tally
	var kb [32]byte
	for more := !empty; more; {
		k, ok := p.key(&kb)
		if !ok {
			return false
		}
		switch string(k) {
		case "role":
			vs := p.i
			if p.peek() == '"' {
				if _, ok := p.str(); !ok {
					return false
				}
				roleStart, roleEnd = vs+1, p.i-1
			} else {
				if !p.skipValue() {
					return false
				}
				p.semantic(fmt.Sprintf(`"messages"[%d].role must be a string, got %s`, idx, p.raw(vs)))
				roleStart, roleEnd = vs, vs
			}
		case "content":
			if content == absent {
				snap = p.snapshot()
			} else {
				p.t = snap // a duplicated member: the last one wins
			}
			vs := p.i
			switch p.peek() {
			case '"':
				if _, ok := p.text(); !ok {
					return false
				}
				content = present
			case '[':
				if !p.parts(idx) {
					return false
				}
				content = present
			case 'n':
				if !p.literal("null") {
					return false
				}
				content = null
			default:
				if !p.skipValue() {
					return false
				}
				p.semantic(fmt.Sprintf(`"messages"[%d].content must be a string or an array of content parts, got %s`, idx, p.raw(vs)))
				content = present
			}
		default:
			if !p.skipValue() {
				return false
			}
		}
		if more, ok = p.next('}'); !ok {
			return false
		}
	}
	if roleStart < 0 {
		p.semantic(fmt.Sprintf(`"messages"[%d].role is missing`, idx))
		return true
	}
	role := p.b[roleStart:roleEnd]
	if content != present && !p.equal(role, "assistant") {
		p.semantic(fmt.Sprintf(`"messages"[%d].content is missing`, idx))
		return true
	}
	if p.t.hashing {
		p.hash(roleMarker)
		p.hash(role)
	}
	p.t.fixed += MessageOverheadTokens
	return true
}

// equal reports whether the raw string content raw (between its quotes) decodes to s.
func (p *parser) equal(raw []byte, s string) bool {
	if string(raw) == s {
		return true
	}
	if len(raw) > 6*len(s) || bytes.IndexByte(raw, '\\') < 0 {
		return false
	}
	var buf [64]byte
	return string(appendUnescaped(buf[:0], raw)) == s
}

// parts reads the array of content parts of "messages"[idx].
func (p *parser) parts(idx int) bool {
	empty, ok := p.open()
	if !ok || empty {
		return ok
	}
	for j, more := 0, true; more; j++ {
		if !p.part(idx, j) {
			return false
		}
		if more, ok = p.next(']'); !ok {
			return false
		}
	}
	return true
}

// part reads "messages"[idx].content[j]: a text part counts its text, any other type counts
// ParseOptions.NonTextTokens.
func (p *parser) part(idx, j int) bool {
	p.ws()
	start := p.i
	if p.peek() != '{' {
		if !p.skipValue() {
			return false
		}
		p.semantic(fmt.Sprintf(`"messages"[%d].content[%d] must be an object, got %s`, idx, j, p.raw(start)))
		return true
	}
	empty, ok := p.open()
	if !ok {
		return false
	}
	typ := []byte(nil)
	typSeen, textSeen, textDone := false, false, false
	textAt := -1
	var snap tally
	var kb [32]byte
	for more := !empty; more; {
		k, ok := p.key(&kb)
		if !ok {
			return false
		}
		vs := p.i
		switch string(k) {
		case "type":
			if p.peek() == '"' {
				if _, ok := p.str(); !ok {
					return false
				}
				typ = p.b[vs+1 : p.i-1]
			} else {
				if !p.skipValue() {
					return false
				}
				p.semantic(fmt.Sprintf(`"messages"[%d].content[%d].type must be a string, got %s`, idx, j, p.raw(vs)))
				typ = nil
			}
			typSeen = true
		case "text":
			textSeen = true
			if textDone {
				p.t = snap // a duplicated member: the last one wins
				textDone = false
			}
			switch {
			case p.peek() != '"':
				if !p.skipValue() {
					return false
				}
				p.semantic(fmt.Sprintf(`"messages"[%d].content[%d].text must be a string, got %s`, idx, j, p.raw(vs)))
				textAt = -1
			case p.equal(typ, "text"):
				snap = p.snapshot()
				if _, ok := p.text(); !ok {
					return false
				}
				textDone, textAt = true, -1
			default: // the type is not known yet: count the text at the end
				if _, ok := p.str(); !ok {
					return false
				}
				textAt = vs
			}
		default:
			if !p.skipValue() {
				return false
			}
		}
		if more, ok = p.next('}'); !ok {
			return false
		}
	}
	switch {
	case !typSeen:
		p.semantic(fmt.Sprintf(`"messages"[%d].content[%d].type is missing`, idx, j))
	case p.equal(typ, "text"):
		if !textSeen {
			p.semantic(fmt.Sprintf(`"messages"[%d].content[%d].text is missing`, idx, j))
		} else if textAt >= 0 {
			end := p.i
			p.i = textAt
			p.text() // already validated
			p.i = end
		}
	default:
		if textDone {
			p.t = snap // the type changed after the text was counted
		}
		p.t.fixed += p.opts.NonTextTokens
		if p.t.hashing {
			var h [8]byte
			binary.LittleEndian.PutUint64(h[:], xxhash.Sum64(p.b[start:p.i]))
			p.hash(partMarker)
			p.hash(h[:])
		}
	}
	return true
}
