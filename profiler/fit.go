package profiler

import (
	"errors"
	"math"
)

// Fit is a least-squares fit's coefficients and quality.
type Fit struct {
	Coef []float64
	// R2 is the coefficient of determination of the measured times; Worst is the largest
	// relative residual |fit − measured| / measured, at point WorstAt.
	R2, Worst float64
	WorstAt   int
}

// errFewPoints: not enough distinct points for the coefficients.
var errFewPoints = errors.New("too few points to fit")

// fitNonNegative fits y ≈ X·β with β ≥ 0, minimising the squared relative residuals (each
// point weighted 1/y², so a 20 ms point counts as much as a 2 s one: the goal is a relative
// error). The constraint is met exactly by trying every set of coefficients held at zero
// (k ≤ 3 here: at most 8 small solves) and keeping the best feasible fit.
func fitNonNegative(x [][]float64, y []float64) (Fit, error) {
	n := len(y)
	if n == 0 {
		return Fit{}, errFewPoints
	}
	k := len(x[0])
	if n < k {
		return Fit{}, errFewPoints
	}
	best, bestSSE := []float64(nil), math.Inf(1)
	for mask := 1; mask < 1<<k; mask++ {
		var free []int
		for j := range k {
			if mask&(1<<j) != 0 {
				free = append(free, j)
			}
		}
		beta, ok := solveWeighted(x, y, free)
		if !ok {
			continue
		}
		feasible := true
		for _, b := range beta {
			feasible = feasible && b >= 0
		}
		if !feasible {
			continue
		}
		if sse := weightedSSE(x, y, beta); sse < bestSSE {
			best, bestSSE = beta, sse
		}
	}
	if best == nil {
		return Fit{}, errFewPoints
	}
	return quality(x, y, best), nil
}

// solveWeighted solves the weighted normal equations for the coefficients in free (the others
// zero); ok is false when they are singular.
func solveWeighted(x [][]float64, y []float64, free []int) ([]float64, bool) {
	m := len(free)
	a := make([][]float64, m)
	for i := range a {
		a[i] = make([]float64, m+1)
	}
	for r := range y {
		w := 1 / (y[r] * y[r])
		for i, fi := range free {
			for j, fj := range free {
				a[i][j] += w * x[r][fi] * x[r][fj]
			}
			a[i][m] += w * x[r][fi] * y[r]
		}
	}
	// Gaussian elimination with partial pivoting; columns scaled so that tokens (10⁴) and
	// constants (1) do not swamp each other.
	scale := make([]float64, m)
	for j := range m {
		scale[j] = math.Sqrt(a[j][j])
		if scale[j] == 0 {
			return nil, false
		}
	}
	for i := range m {
		for j := range m {
			a[i][j] /= scale[i] * scale[j]
		}
		a[i][m] /= scale[i]
	}
	for c := range m {
		p := c
		for r := c + 1; r < m; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		if math.Abs(a[p][c]) < 1e-12 {
			return nil, false
		}
		a[c], a[p] = a[p], a[c]
		for r := range m {
			if r == c {
				continue
			}
			f := a[r][c] / a[c][c]
			for j := c; j <= m; j++ {
				a[r][j] -= f * a[c][j]
			}
		}
	}
	beta := make([]float64, len(x[0]))
	for i, fi := range free {
		beta[fi] = a[i][m] / a[i][i] / scale[i]
	}
	return beta, true
}

func predict(row, beta []float64) (v float64) {
	for j, b := range beta {
		v += b * row[j]
	}
	return v
}

func weightedSSE(x [][]float64, y, beta []float64) (s float64) {
	for r := range y {
		d := (predict(x[r], beta) - y[r]) / y[r]
		s += d * d
	}
	return s
}

func quality(x [][]float64, y, beta []float64) Fit {
	f := Fit{Coef: beta}
	mean := 0.0
	for _, v := range y {
		mean += v
	}
	mean /= float64(len(y))
	var ssRes, ssTot float64
	for r := range y {
		p := predict(x[r], beta)
		ssRes += (p - y[r]) * (p - y[r])
		ssTot += (y[r] - mean) * (y[r] - mean)
		if rel := math.Abs(p-y[r]) / y[r]; rel > f.Worst {
			f.Worst, f.WorstAt = rel, r
		}
	}
	f.R2 = 1
	if ssTot > 0 {
		f.R2 = 1 - ssRes/ssTot
	}
	return f
}
