// Package page is Narwhal's live page (index.html, docs/history.md): one self-contained HTML
// document, vanilla JavaScript and SVG. Served live at the admin listener's / it polls
// /narwhal/state and /narwhal/history; written with Static it draws a recorded history instead
// (narwhal sim --plot FILE.html), with the same charts from the same history shape.
package page

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"

	"github.com/narwhal-llm/narwhal/history"
)

//go:embed index.html
var HTML []byte

// Static writes the page with data (Recorded) embedded: it draws that and polls nothing.
func Static(w io.Writer, data Recorded) error {
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	b = bytes.ReplaceAll(b, []byte("</"), []byte(`<\/`)) // no "</script>" inside the script
	i := bytes.Index(HTML, []byte("<script>"))
	if i < 0 {
		return fmt.Errorf("page: index.html has no <script>")
	}
	var out bytes.Buffer
	out.Write(HTML[:i])
	out.WriteString("<script>window.NARWHAL_HISTORY = ")
	out.Write(b)
	out.WriteString(";</script>\n")
	out.Write(HTML[i:])
	_, err = w.Write(out.Bytes())
	return err
}

// Recorded is what a static page draws: one history per run (a policy of narwhal sim), each
// in /narwhal/history's shape.
type Recorded struct {
	Title string `json:"title"`
	Runs  []Run  `json:"runs"`
}

// Run is one recorded history.
type Run struct {
	Name    string                            `json:"name"`
	History history.Document[json.RawMessage] `json:"history"`
}
