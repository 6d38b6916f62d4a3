//go:build !race

package picker

const raceEnabled = false
