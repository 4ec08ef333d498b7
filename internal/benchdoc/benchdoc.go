// Package benchdoc holds what the benchmark generators share: writing a generated section
// between its markers in a document, and formatting seconds for their tables.
package benchdoc

import (
	"fmt"
	"os"
	"strings"
)

// Replace writes section (which starts with begin and ends with end and a newline) in place of
// the text from begin through end and its newline in the file at path.
func Replace(path, begin, end, section string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(doc)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %s … %s markers", path, begin, end)
	}
	return os.WriteFile(path, []byte(s[:i]+section+s[j+len(end)+1:]), 0o644)
}
