package gateway

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Envoy's connection manager defaults that bound a header mutation's
// result (max_request_headers_count, max_request_headers_kb).
const (
	maxHeadersCount = 100
	maxHeadersBytes = 60 * 1024
)

// errSpurious marks a reply Envoy treats as spurious (its
// FailedPrecondition status).
type errSpurious struct{ msg string }

func (e errSpurious) Error() string { return e.msg }

func spurious(msg string) error { return errSpurious{msg} }

func isSpurious(err error) bool {
	var s errSpurious
	return errors.As(err, &s)
}

// errFatal marks a reply Envoy answers with a 500 local reply regardless of
// failure_mode_allow (a rejected mutation, a content-length mismatch).
type errFatal struct {
	kind ViolationKind
	msg  string
}

func (e errFatal) Error() string { return e.msg }

// mutationRules are the parts of Envoy's mutation checker that vary.
type mutationRules struct {
	// replacing: the reply has status CONTINUE_AND_REPLACE, which lets
	// :method change.
	replacing bool
	// skipContentLength: the body is streamed, so Envoy drops any
	// content-length the mutation sets.
	skipContentLength bool
}

// refusal returns why Envoy's default mutation rules (no allow_all_routing,
// no allow_envoy, disallow_system false) skip an operation on name, or "".
func refusal(name string, remove bool, rules mutationRules) string {
	if remove && (strings.HasPrefix(name, ":") || name == "host") {
		return "system header may not be removed"
	}
	switch name {
	case "host", ":authority", ":scheme":
		return "routing header (allow_all_routing is false)"
	case ":method":
		if !rules.replacing || remove {
			return "routing header (allow_all_routing is false)"
		}
	}
	if strings.HasPrefix(name, "x-envoy") {
		return "x-envoy header (allow_envoy is false)"
	}
	return ""
}

// applyHeaderMutation applies m to h as Envoy's
// MutationUtils::applyHeaderMutations does under the default mutation rules.
// Refused entries are skipped and reported through note; an error is fatal
// (Envoy answers 500) and leaves the entries before it applied, as Envoy
// does.
func applyHeaderMutation(m *extprocv3.HeaderMutation, h *Headers, rules mutationRules, note func(ViolationKind, string)) error {
	if m == nil {
		return nil
	}
	if len(m.GetRemoveHeaders()) > maxHeadersCount || len(m.GetSetHeaders()) > maxHeadersCount {
		return errFatal{InvalidHeader, fmt.Sprintf("Header mutation remove header count %d or set header count %d exceed the HCM header countlimit %d",
			len(m.GetRemoveHeaders()), len(m.GetSetHeaders()), maxHeadersCount)}
	}
	for _, name := range m.GetRemoveHeaders() {
		if !headerNameValid(name) {
			return errFatal{InvalidHeader, "Invalid character in remove_headers mutation."}
		}
		name = strings.ToLower(name)
		if why := refusal(name, true, rules); why != "" {
			note(RefusedMutation, "remove "+name+": "+why)
			continue
		}
		h.Del(name)
	}
	for _, opt := range m.GetSetHeaders() {
		hv := opt.GetHeader()
		if hv == nil {
			continue
		}
		if rules.skipContentLength && strings.EqualFold(hv.GetKey(), "content-length") {
			continue
		}
		if hv.GetValue() != "" && len(hv.GetRawValue()) > 0 {
			return errFatal{ValueAndRawValue, "Only one of value or raw_value in the HeaderValue message should be set."}
		}
		value := string(hv.GetRawValue())
		if hv.GetValue() != "" {
			note(ValueNotRawValue, fmt.Sprintf("set %s: value %q ignored, header set to the empty raw_value", strings.ToLower(hv.GetKey()), hv.GetValue()))
		}
		if !headerNameValid(hv.GetKey()) || !headerValueValid(value) {
			return errFatal{InvalidHeader, "Invalid character in set_headers mutation."}
		}
		name := strings.ToLower(hv.GetKey())
		if why := refusal(name, false, rules); why != "" {
			note(RefusedMutation, "set "+name+": "+why)
			continue
		}
		if name == ":status" {
			if code, err := strconv.Atoi(value); err != nil || code < 200 || code > 599 {
				note(RefusedMutation, "set :status: invalid status "+strconv.Quote(value))
				continue
			}
		}
		// Envoy's ext_proc honours only the deprecated `append` (default
		// false); append_action is ignored.
		//lint:ignore SA1019 the client plays Envoy, which reads the deprecated field
		if opt.GetAppend().GetValue() {
			h.Add(name, value)
		} else {
			h.Set(name, value)
		}
	}
	size := 0
	for _, f := range *h {
		size += len(f.Key) + len(f.Value)
	}
	if len(*h) > maxHeadersCount || size > maxHeadersBytes {
		return errFatal{InvalidHeader, fmt.Sprintf("Header mutation causes end result header count %d or header size %d bytes, exceeding the count limit %d or the size limit %d kilobytes",
			len(*h), size, maxHeadersCount, maxHeadersBytes/1024)}
	}
	return nil
}

// applyBodyMutation replaces or clears body as MutationUtils::applyBodyMutations
// does; a streamed_response is not a body mutation and leaves body alone.
func applyBodyMutation(m *extprocv3.BodyMutation, body []byte) []byte {
	switch mu := m.GetMutation().(type) {
	case *extprocv3.BodyMutation_ClearBody:
		if mu.ClearBody {
			return nil
		}
	case *extprocv3.BodyMutation_Body:
		return append([]byte(nil), mu.Body...)
	}
	return body
}
