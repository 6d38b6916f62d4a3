package workload

// Block-id name spaces. The top byte of a block id says where the id came
// from, so ids from different sources never collide: a trace's small
// integers, an Azure request's unique blocks and a generator's hashed ids
// live in disjoint ranges. The low 56 bits carry the id proper.
const (
	nsShift     = 56
	idMask      = uint64(1)<<nsShift - 1
	nsMooncake  = uint64(1) << nsShift
	nsAzure     = uint64(2) << nsShift
	nsGenerated = uint64(3) << nsShift
)

// MaxTraceBlockID is the largest hash_id a Mooncake trace may use: ids are
// kept in the low 56 bits of a block id.
const MaxTraceBlockID = idMask

// Namespace tags for the generators' hashed ids.
const (
	tagSystemPrompt = 0x5359_5350 // "SYSP"
	tagOwnText      = 0x4f57_4e54 // "OWNT"
	tagAzure        = 0x415a_5552 // "AZUR"
)

// splitmix64 is the output function of Vigna's SplitMix64 generator
// (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014; constants from https://prng.di.unimi.it/splitmix64.c). It is
// a bijection on uint64 with good avalanche, used here to derive block ids.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// mix chains v into the running hash h.
func mix(h, v uint64) uint64 {
	return splitmix64(h ^ splitmix64(v))
}

// hashString hashes s with FNV-1a (64-bit) and finishes with splitmix64;
// "" hashes to a fixed value.
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return splitmix64(h)
}

// idBase hashes the coordinates that all blocks of one prompt have in
// common (seed, workload, tag, tenant, prompt index).
func idBase(coords ...uint64) uint64 {
	h := uint64(0)
	for _, c := range coords {
		h = mix(h, c)
	}
	return h
}

// blockID derives the id of block b of the prompt whose coordinates hash
// to base, in name space ns. Two ids collide only if their 56-bit hashes
// do: with a million distinct blocks the probability of any collision is
// about 2^-17.
func blockID(ns, base uint64, b int) uint64 {
	return ns | mix(base, uint64(b))&idMask
}
