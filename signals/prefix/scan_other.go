//go:build !amd64 || purego

package prefix

// appendString is appendStringGeneric on platforms without an assembly
// scan.
func appendString(dst, b []byte, i int) ([]byte, int, bool) {
	return appendStringGeneric(dst, b, i)
}
