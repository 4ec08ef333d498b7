package extproc

// ResponseObserver watches an OpenAI-compatible response body go by, in chunks split anywhere
// (Envoy's STREAMED response body), and reports what the router needs: when the first token
// came, how many token events there were, whether the stream finished, and the usage.
//
// It reads either a server-sent event stream (stream=true: "data: {json}" lines, "data:
// [DONE]" at the end) or one JSON document (stream=false). SetStreaming says which; without
// it the first non-blank byte decides ('{' for JSON, anything else for SSE).
//
// It is a byte-at-a-time state machine over the SSE lines and the JSON inside them, with bulk
// steps over string contents: it keeps no part of the body, so its memory is constant
// whatever the line lengths, it never allocates, and its results do not depend on where the
// chunks are split. Malformed input is tolerated: an event whose JSON does not complete on its
// line is ignored. Multi-line SSE data fields are read line by line (each line must hold a
// whole JSON object, as every OpenAI-compatible server sends it).
//
// The zero value is ready to use; a ResponseObserver is not safe for concurrent use.
type ResponseObserver struct {
	mode   uint8 // modeAuto, modeSSE or modeJSON
	line   uint8 // SSE line state
	match  uint8 // bytes of "data:" or "[DONE]" matched so far
	cr     bool  // the previous byte was '\r' (a following '\n' ends no second line)
	closed bool  // JSON mode: the document ended

	j jsonScan

	events     int
	done       bool
	usageOK    bool
	prompt     int
	completion int
}

const (
	modeAuto = iota
	modeSSE
	modeJSON
)

// SSE line states.
const (
	lnStart   = iota // at the start of a line
	lnField          // matching "data:"
	lnPayload        // after "data:", before the first non-blank byte
	lnJSON           // in a data line's JSON
	lnDone           // matching "[DONE]"
	lnSkip           // in a line that is of no interest
)

// SetStreaming says whether the body is an SSE stream (true, content-type text/event-stream)
// or one JSON document (false). Call it before the first Write.
func (o *ResponseObserver) SetStreaming(streaming bool) {
	if streaming {
		o.mode = modeSSE
	} else {
		o.mode = modeJSON
	}
}

// Reset makes o ready for a new response.
func (o *ResponseObserver) Reset() { *o = ResponseObserver{} }

// Events returns the number of events (SSE data events other than [DONE], or the one JSON
// document) that carried at least one choice with generated content: non-empty text,
// delta/message content, reasoning_content, reasoning or refusal, or tool calls. In a stream
// each such event is about one token.
func (o *ResponseObserver) Events() int { return o.events }

// FirstToken reports whether an event with generated content has been seen.
func (o *ResponseObserver) FirstToken() bool { return o.events > 0 }

// Done reports whether the response ended by its own framing: "data: [DONE]" in a stream, the
// end of the document for a JSON body.
func (o *ResponseObserver) Done() bool { return o.done }

// Usage returns the usage.prompt_tokens and usage.completion_tokens of the last event that
// had a usage object (a missing member is 0); ok is false when none had.
func (o *ResponseObserver) Usage() (prompt, completion int, ok bool) {
	return o.prompt, o.completion, o.usageOK
}

// Write observes the next chunk of the body. It never retains chunk.
func (o *ResponseObserver) Write(chunk []byte) {
	i := 0
	for i < len(chunk) {
		switch o.mode {
		case modeAuto:
			if whitespace[chunk[i]] {
				i++
				continue
			}
			o.mode = modeSSE
			if chunk[i] == '{' {
				o.mode = modeJSON
			}
		case modeJSON:
			if o.closed {
				return
			}
			i = o.j.feed(chunk, i, false)
			if o.j.st == stEnd {
				o.closed, o.done = true, true
				o.commit()
			}
		default:
			i = o.sse(chunk, i)
		}
	}
}

// commit records the results of one complete JSON event.
func (o *ResponseObserver) commit() {
	if o.j.content {
		o.events++
	}
	if o.j.usage {
		o.prompt, o.completion, o.usageOK = int(o.j.prompt), int(o.j.completion), true
	}
}

// sse processes SSE bytes from p[i:] and returns how far it got.
func (o *ResponseObserver) sse(p []byte, i int) int {
	for i < len(p) {
		c := p[i]
		if c == '\n' || c == '\r' {
			if c == '\n' && o.cr {
				o.cr = false // the '\n' of a "\r\n"
			} else {
				o.endLine()
				o.cr = c == '\r'
			}
			i++
			continue
		}
		o.cr = false
		switch o.line {
		case lnStart:
			o.line, o.match = lnSkip, 0
			if c == 'd' {
				o.line, o.match = lnField, 1
			}
			i++
		case lnField:
			if c != "data:"[o.match] {
				o.line = lnSkip
				continue
			}
			i++
			if o.match++; o.match == 5 {
				o.line = lnPayload
			}
		case lnPayload:
			switch c {
			case ' ', '\t':
				i++
			case '{':
				o.line = lnJSON
				o.j = jsonScan{}
			case '[':
				o.line, o.match = lnDone, 1
				i++
			default:
				o.line = lnSkip
			}
		case lnJSON:
			i = o.j.feed(p, i, true)
		case lnDone:
			switch {
			case o.match < 6 && c == "[DONE]"[o.match]:
				o.match++
			case o.match == 6 && (c == ' ' || c == '\t'):
			default:
				o.line = lnSkip
			}
			i++
		default: // lnSkip: jump to the end of the line
			for i < len(p) && p[i] != '\n' && p[i] != '\r' {
				i++
			}
		}
	}
	return i
}

// endLine finishes the current SSE line.
func (o *ResponseObserver) endLine() {
	switch o.line {
	case lnJSON:
		if o.j.st == stEnd {
			o.commit()
		}
	case lnDone:
		if o.match == 6 {
			o.done = true
		}
	}
	o.line = lnStart
}

// jsonScan is an incremental, lenient JSON reader that follows just enough of the document's
// structure to find the members the observer reads. It keeps no input: strings are matched
// against the few key names of interest as they stream by.
type jsonScan struct {
	st     uint8
	ctxs   [maxTracked]uint8 // what the container at depth d+1 is
	depth  int32
	objs   uint64 // bit d: the container at depth d+1 is an object (d < 64)
	key    uint8  // the member whose value comes next
	keyLen uint8  // bytes of the current key in keyBuf; keyTooLong when it cannot match
	keyBuf [maxKey]byte

	isKey      bool  // the string being read is a key
	strContent bool  // the string being read is generated text and nothing of it was seen yet
	target     uint8 // the number being read is a usage member (kPromptTokens...)
	num        int64
	numOK      bool

	content    bool
	usage      bool
	prompt     int64
	completion int64
}

// jsonScan states.
const (
	stValue      = iota // expecting a value
	stKeyOrClose        // after '{'
	stKey               // after ',' in an object
	stColon             // after a key
	stAfter             // after a value
	stString            // in a string
	stEscape            // after '\' in a string
	stBare              // in a number or a literal
	stEnd               // the top-level value is complete
	stBad               // malformed: ignore the rest
)

// What a container is.
const (
	cOther   = iota
	cRoot    // the top-level object
	cChoices // root.choices
	cChoice  // root.choices[i]
	cDelta   // root.choices[i].delta or .message
	cTools   // root.choices[i].delta.tool_calls
	cUsage   // root.usage
)

// Members of interest.
const (
	kOther = iota
	kChoices
	kUsage
	kDelta
	kMessage
	kText
	kContent
	kReasoningContent
	kReasoning
	kRefusal
	kToolCalls
	kPromptTokens
	kCompletionTokens
)

const (
	maxTracked = 8
	maxKey     = 24
	keyTooLong = 255
	maxDepth   = 1 << 20
	maxNumber  = 1 << 40
)

func keyID(k []byte) uint8 {
	switch string(k) {
	case "choices":
		return kChoices
	case "usage":
		return kUsage
	case "delta":
		return kDelta
	case "message":
		return kMessage
	case "text":
		return kText
	case "content":
		return kContent
	case "reasoning_content":
		return kReasoningContent
	case "reasoning":
		return kReasoning
	case "refusal":
		return kRefusal
	case "tool_calls":
		return kToolCalls
	case "prompt_tokens":
		return kPromptTokens
	case "completion_tokens":
		return kCompletionTokens
	}
	return kOther
}

// ctx returns what the innermost open container is.
func (j *jsonScan) ctx() uint8 {
	if j.depth == 0 || j.depth > maxTracked {
		return cOther
	}
	return j.ctxs[j.depth-1]
}

// feed processes p[i:] and returns how far it got: to the end of p, or (sse) to the first line
// end, which it leaves unconsumed.
func (j *jsonScan) feed(p []byte, i int, sse bool) int {
	for i < len(p) {
		c := p[i]
		if sse && (c == '\n' || c == '\r') {
			return i
		}
		switch j.st {
		case stString:
			k := plainRun(p, i) // the next '"', '\\' or control byte
			if k < len(p) && p[k] == '"' && j.isKey && j.keyLen == 0 {
				// A whole key in this chunk: match it in place.
				j.key, j.st = keyID(p[i:k]), stColon
				i = k + 1
				continue
			}
			if k > i && (j.strContent || j.isKey) {
				j.strBytes(p[i:k])
			}
			if i = k; k == len(p) {
				return i
			}
			switch c = p[k]; c {
			case '"':
				j.endString()
			case '\\':
				j.strBytes(p[k : k+1])
				j.st = stEscape
			default: // a control byte: a line end ends the event, else it is taken as text
				if sse && (c == '\n' || c == '\r') {
					return i
				}
				j.strBytes(p[k : k+1])
			}
			i++
		case stEscape:
			j.st = stString
			i++
		case stBare:
			for ; i < len(p); i++ {
				c = p[i]
				if c >= '0' && c <= '9' {
					if j.num = j.num*10 + int64(c-'0'); j.num > maxNumber {
						j.numOK = false
					}
					continue
				}
				if c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == '}' || c == ']' || c == ':' {
					j.endBare() // the delimiter is structure: the loop takes it next
					break
				}
				j.numOK = false
			}
		case stEnd, stBad:
			if sse {
				for i < len(p) && p[i] != '\n' && p[i] != '\r' {
					i++
				}
				return i
			}
			return len(p)
		default:
			if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
				i++
				continue
			}
			j.structure(c)
			if j.st != stBare {
				i++
			}
		}
	}
	return i
}

// strBytes takes a piece of the current string (an escape counts as content).
func (j *jsonScan) strBytes(b []byte) {
	if j.strContent {
		j.content, j.strContent = true, false
	}
	if j.isKey && j.keyLen != keyTooLong {
		if int(j.keyLen)+len(b) > maxKey || b[0] == '\\' {
			j.keyLen = keyTooLong
		} else {
			j.keyLen += uint8(copy(j.keyBuf[j.keyLen:], b))
		}
	}
}

func (j *jsonScan) endString() {
	if j.isKey {
		j.key = kOther
		if j.keyLen != keyTooLong {
			j.key = keyID(j.keyBuf[:j.keyLen])
		}
		j.st = stColon
		return
	}
	j.strContent = false
	j.afterValue()
}

func (j *jsonScan) endBare() {
	if j.target != 0 && j.numOK {
		j.usage = true
		if j.target == kPromptTokens {
			j.prompt = j.num
		} else {
			j.completion = j.num
		}
	}
	j.target = 0
	j.afterValue()
}

func (j *jsonScan) afterValue() {
	j.st = stAfter
	if j.depth == 0 {
		j.st = stEnd
	}
}

// structure handles one non-blank byte outside strings and bare values.
func (j *jsonScan) structure(c byte) {
	switch j.st {
	case stValue:
		if c == ']' { // an empty array (or a trailing comma in one)
			j.close(false)
			return
		}
		j.value(c)
	case stKeyOrClose, stKey:
		switch c {
		case '"':
			j.st, j.isKey, j.keyLen = stString, true, 0
		case '}':
			j.close(true)
		default:
			j.st = stBad
		}
	case stColon:
		j.st = stBad
		if c == ':' {
			j.st = stValue
		}
	case stAfter:
		switch c {
		case ',':
			j.st = stValue
			if j.depth <= 64 && j.objs>>(j.depth-1)&1 == 1 {
				j.st = stKey
			}
		case '}', ']':
			j.close(c == '}')
		case ':': // lenient (a key past the depth where object kinds are kept)
			j.st = stValue
		default:
			j.st = stBad
		}
	}
}

// value starts the value whose first byte is c, in the current container after j.key.
func (j *jsonScan) value(c byte) {
	parent := j.ctx()
	if parent == cTools {
		j.content = true // a tool call is being generated
	}
	switch {
	case c == '{':
		child := uint8(cOther)
		switch {
		case j.depth == 0:
			child = cRoot
		case parent == cRoot && j.key == kUsage:
			child = cUsage
		case parent == cChoices:
			child = cChoice
		case parent == cChoice && (j.key == kDelta || j.key == kMessage):
			child = cDelta
		}
		j.open(true, child)
		if j.st != stBad {
			j.st = stKeyOrClose
		}
	case c == '[':
		child := uint8(cOther)
		switch {
		case parent == cRoot && j.key == kChoices:
			child = cChoices
		case parent == cDelta && j.key == kToolCalls:
			child = cTools
		}
		j.open(false, child)
		if j.st != stBad {
			j.st = stValue
		}
	case c == '"':
		j.st, j.isKey = stString, false
		j.strContent = parent == cChoice && j.key == kText ||
			parent == cDelta && (j.key == kContent || j.key == kReasoningContent || j.key == kReasoning || j.key == kRefusal)
	case c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z':
		j.st, j.num, j.numOK, j.target = stBare, 0, c >= '0' && c <= '9', 0
		if parent == cUsage && (j.key == kPromptTokens || j.key == kCompletionTokens) {
			j.target = j.key
		}
	default:
		j.st = stBad
	}
}

func (j *jsonScan) open(obj bool, child uint8) {
	if j.depth >= maxDepth {
		j.st = stBad
		return
	}
	if j.depth < 64 {
		j.objs &^= 1 << j.depth
		if obj {
			j.objs |= 1 << j.depth
		}
	}
	if j.depth < maxTracked {
		j.ctxs[j.depth] = child
	}
	j.depth++
}

// close ends the innermost container with '}' (obj) or ']'; a mismatch is malformed.
func (j *jsonScan) close(obj bool) {
	if j.depth == 0 || j.depth <= 64 && (j.objs>>(j.depth-1)&1 == 1) != obj {
		j.st = stBad
		return
	}
	j.depth--
	j.afterValue()
}
