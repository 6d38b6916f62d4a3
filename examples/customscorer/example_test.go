package customscorer_test

import (
	"os"

	"github.com/inferroute/inferroute/examples/customscorer"
)

// The client sits in us-east1-b. pod-a is in that zone but busy and dear;
// pod-c is idle and cheap but in another region; pod-b, same region,
// moderately loaded, wins on the weighted sum:
//
//	queue (weight 2):   waiting 3, 1, 0 → inverse min-max 0, 2/3, 1   → 0, 1.333, 2
//	kv-cache (2):       used 0.5, 0.3, 0.2 → 1 − used                   → 1, 1.4, 1.6
//	zone-affinity (3):  same zone 1, same region 0.5, other 0           → 3, 1.5, 0
//	cost (1):           2.0, 1.0, 0.5 per Mtok → inverse min-max 0, 2/3, 1 → 0, 0.667, 1
//	totals:             4.0, 4.9, 4.6
func ExampleDemo() {
	if err := customscorer.Demo(os.Stdout); err != nil {
		panic(err)
	}
	// Output:
	// request from us-east1-b -> pod-b
	//   endpoint           total              queue           kv-cache      zone-affinity               cost
	//   pod-a              4.000          0.000 (3)        1.000 (0.5)          3.000 (2)          0.000 (2)
	// * pod-b              4.900          1.333 (1)        1.400 (0.3)          1.500 (1)          0.667 (1)
	//   pod-c              4.600          2.000 (0)        1.600 (0.2)          0.000 (0)        1.000 (0.5)
}
