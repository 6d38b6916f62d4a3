package latency

import (
	"math"
	"sync/atomic"
)

// seqVec publishes a coefficient vector to lock-free readers: a sequence
// lock whose words are all atomics, so readers never see a torn vector and
// the race detector has nothing to report. Writers must be serialised by
// the owner; readers retry while a write is in progress.
type seqVec struct {
	seq atomic.Uint64
	v   [maxDim]atomic.Uint64
}

// store publishes x. Callers serialise stores.
func (s *seqVec) store(x *[maxDim]float64) {
	s.seq.Add(1) // odd: write in progress
	for i := range x {
		s.v[i].Store(math.Float64bits(x[i]))
	}
	s.seq.Add(1)
}

// load copies the last published vector into x. It never blocks on a lock;
// it spins only while a store is running, which takes nanoseconds.
func (s *seqVec) load(x *[maxDim]float64) {
	for {
		q := s.seq.Load()
		if q&1 == 0 {
			for i := range x {
				x[i] = math.Float64frombits(s.v[i].Load())
			}
			if s.seq.Load() == q {
				return
			}
		}
	}
}

// atomicFloat is a float64 stored atomically.
type atomicFloat struct{ bits atomic.Uint64 }

func (f *atomicFloat) Load() float64   { return math.Float64frombits(f.bits.Load()) }
func (f *atomicFloat) Store(v float64) { f.bits.Store(math.Float64bits(v)) }
