package gateway

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// HeaderField is one entry of a header map. Key is lower-case.
type HeaderField struct {
	Key   string
	Value string
}

// Headers is an HTTP header map as Envoy's HeaderMap holds it: ordered,
// multi-valued, keys in lower case, pseudo-headers (:method, :path,
// :authority, :scheme on requests; :status on responses) first.
//
// All methods take keys in any case and compare them lower-cased.
type Headers []HeaderField

// Get returns the first value of key, or "".
func (h Headers) Get(key string) string {
	key = strings.ToLower(key)
	for _, f := range h {
		if f.Key == key {
			return f.Value
		}
	}
	return ""
}

// Values returns every value of key in order.
func (h Headers) Values(key string) []string {
	key = strings.ToLower(key)
	var vs []string
	for _, f := range h {
		if f.Key == key {
			vs = append(vs, f.Value)
		}
	}
	return vs
}

// Has reports whether key is present.
func (h Headers) Has(key string) bool {
	key = strings.ToLower(key)
	for _, f := range h {
		if f.Key == key {
			return true
		}
	}
	return false
}

// Set replaces every value of key by value, keeping the position of the first
// entry (Envoy's setCopy); it appends key when absent.
func (h *Headers) Set(key, value string) {
	key = strings.ToLower(key)
	out := (*h)[:0]
	done := false
	for _, f := range *h {
		if f.Key != key {
			out = append(out, f)
			continue
		}
		if !done {
			out = append(out, HeaderField{Key: key, Value: value})
			done = true
		}
	}
	if !done {
		out = append(out, HeaderField{Key: key, Value: value})
	}
	*h = out
}

// Add appends a value for key (Envoy's addCopy).
func (h *Headers) Add(key, value string) {
	*h = append(*h, HeaderField{Key: strings.ToLower(key), Value: value})
}

// Del removes every value of key.
func (h *Headers) Del(key string) {
	key = strings.ToLower(key)
	out := (*h)[:0]
	for _, f := range *h {
		if f.Key != key {
			out = append(out, f)
		}
	}
	*h = out
}

// Clone returns a copy that shares nothing with h.
func (h Headers) Clone() Headers {
	if h == nil {
		return nil
	}
	return append(Headers(nil), h...)
}

// HTTPHeader returns the regular (non-pseudo) headers as an http.Header.
func (h Headers) HTTPHeader() http.Header {
	out := make(http.Header, len(h))
	for _, f := range h {
		if strings.HasPrefix(f.Key, ":") {
			continue
		}
		out.Add(f.Key, f.Value)
	}
	return out
}

// Status returns the :status pseudo-header as a number (0 when absent or not
// a number).
func (h Headers) Status() int {
	n, err := strconv.Atoi(h.Get(":status"))
	if err != nil {
		return 0
	}
	return n
}

// proto renders h as Envoy sends it: every entry a HeaderValue with the key
// and raw_value set, value empty (the send_header_raw_value behaviour).
func (h Headers) proto() *corev3.HeaderMap {
	hm := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, 0, len(h))}
	for _, f := range h {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: f.Key, RawValue: []byte(f.Value)})
	}
	return hm
}

// hopByHop lists the connection-specific headers that Envoy's connection
// manager strips before filters run and never forwards.
var hopByHop = map[string]bool{
	"connection":        true,
	"keep-alive":        true,
	"proxy-connection":  true,
	"transfer-encoding": true,
	"upgrade":           true,
	"te":                true,
}

// NewRequestHeaders builds the request header map Envoy's connection manager
// hands to the ext_proc filter for an HTTP/1.1 request: :method, :path,
// :authority and :scheme first, then the client's headers lower-cased
// (sorted by key; host becomes :authority; hop-by-hop headers dropped),
// x-forwarded-proto when absent, and x-request-id (a new UUID when the client
// sent none; Envoy keeps a client's x-request-id for internal requests, the
// default without use_remote_address).
func NewRequestHeaders(method, path, authority string, hdr http.Header) Headers {
	h := Headers{
		{Key: ":method", Value: method},
		{Key: ":path", Value: path},
		{Key: ":authority", Value: authority},
		{Key: ":scheme", Value: "http"},
	}
	h = appendSorted(h, hdr, "host")
	if !h.Has("x-forwarded-proto") {
		h.Add("x-forwarded-proto", "http")
	}
	if !h.Has("x-request-id") {
		h.Add("x-request-id", newUUID())
	}
	return h
}

// NewResponseHeaders builds the response header map the ext_proc filter sees
// for an upstream response: :status first, then the headers lower-cased
// (sorted by key, hop-by-hop headers dropped).
func NewResponseHeaders(status int, hdr http.Header) Headers {
	h := Headers{{Key: ":status", Value: strconv.Itoa(status)}}
	return appendSorted(h, hdr, "")
}

func appendSorted(h Headers, hdr http.Header, skip string) Headers {
	keys := make([]string, 0, len(hdr))
	for k := range hdr {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		if lk == skip || hopByHop[lk] {
			continue
		}
		for _, v := range hdr[k] {
			h = append(h, HeaderField{Key: lk, Value: v})
		}
	}
	return h
}

// newUUID returns a random (version 4) UUID, as Envoy generates for
// x-request-id.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// headerNameValid mirrors Envoy's HeaderUtility::headerNameIsValid: an
// HTTP/1 token (upper case allowed), or ':' followed by lower-case token
// characters for pseudo-headers. Unlike Envoy it also refuses the empty name.
func headerNameValid(name string) bool {
	if name == "" {
		return false
	}
	pseudo := name[0] == ':'
	if pseudo {
		name = name[1:]
		if name == "" {
			return false
		}
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c >= 'A' && c <= 'Z':
			if pseudo {
				return false
			}
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// headerValueValid mirrors Envoy's HeaderUtility::headerValueIsValid
// (field-content with obs-text allowed): no control characters but HTAB.
func headerValueValid(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
