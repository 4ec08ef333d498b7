package history

import (
	"runtime"
	"testing"
	"time"
)

// The memory bound docs/history.md states: a full ring of the default 3,600 samples holds at most
// 512 + 112 × engines bytes a sample (measured: about 960 B at 8 engines, 6.3 KB at 64).
func TestMemoryPerSample(t *testing.T) {
	for _, engines := range []int{8, 64} {
		f := testFleet(t, engines)
		read := Reading{T: t0, Fleet: f.Snapshot()}
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		before := ms.HeapAlloc
		r := NewRing(3600, 1, func(rec) time.Time { return t0 })
		for i := range 3600 {
			read.T = t0.Add(time.Duration(i) * time.Second)
			s := NewSample(&read, &read, 0.5)
			q := Quantiles{}
			s.TTFT, s.TTFTProjected, s.TPOT = &q, &q, &q
			r.Add(s)
		}
		runtime.GC()
		runtime.ReadMemStats(&ms)
		per := float64(ms.HeapAlloc-before) / 3600
		t.Logf("%d engines: 3600 samples hold %.1f MB (%.0f B a sample)", engines, per*3600/1e6, per)
		if bound := 512 + 112*float64(engines); per > bound {
			t.Errorf("%d engines: %.0f B a sample, over the stated %.0f", engines, per, bound)
		}
		runtime.KeepAlive(r)
	}
}
