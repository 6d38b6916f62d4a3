package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRunBenchUnknown(t *testing.T) {
	var b bytes.Buffer
	err := runBench(context.Background(), &b, "nope", 1, 0, 1, 0, 1)
	assert.ErrorContains(t, err, `unknown benchmark "nope"`)
	assert.Empty(t, b.String())
}
