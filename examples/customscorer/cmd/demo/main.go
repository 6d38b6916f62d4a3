// Command demo runs one pick with the custom zone-affinity and cost scorers
// registered next to the built-ins, and prints the decision breakdown.
//
//	go run ./examples/customscorer/cmd/demo
package main

import (
	"fmt"
	"os"

	"github.com/inferroute/inferroute/examples/customscorer"
)

func main() {
	if err := customscorer.Demo(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
