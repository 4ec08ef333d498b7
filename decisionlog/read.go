package decisionlog

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
)

// Line is one line of a decision log, decoded by its kind: exactly one of Config, Fleet and
// Decision is set. Raw is the line as written (valid until the next line is read).
type Line struct {
	Num      int // from 1
	Config   *Config
	Fleet    *Fleet
	Decision *Decision
	Raw      []byte
}

// TimeS is the line's time_s.
func (l *Line) TimeS() float64 {
	switch {
	case l.Config != nil:
		return l.Config.TimeS
	case l.Fleet != nil:
		return l.Fleet.TimeS
	}
	return l.Decision.TimeS
}

// Read calls fn with every line of the log r, in order, and stops at fn's first error. A line
// that is not JSON, or not of a known kind, is an error naming its number.
func Read(r io.Reader, fn func(Line) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		l, err := decode(n, sc.Bytes())
		if err != nil {
			return err
		}
		if err := fn(l); err != nil {
			return err
		}
	}
	return sc.Err()
}

// decode reads one line by its kind.
func decode(n int, b []byte) (Line, error) {
	l := Line{Num: n, Raw: b}
	var head struct {
		Kind Kind `json:"kind"`
	}
	err := json.Unmarshal(b, &head)
	if err == nil {
		switch head.Kind {
		case KindConfig:
			l.Config = new(Config)
			err = json.Unmarshal(b, l.Config)
		case KindFleet:
			l.Fleet = new(Fleet)
			err = json.Unmarshal(b, l.Fleet)
		case KindDecision:
			l.Decision = new(Decision)
			err = json.Unmarshal(b, l.Decision)
		default:
			err = fmt.Errorf("unknown kind %q", head.Kind)
		}
	}
	if err != nil {
		return Line{}, fmt.Errorf("line %d: %w", n, err)
	}
	return l, nil
}
