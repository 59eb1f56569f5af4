package e2e

import (
	"fmt"
	"os"
)

// runHelper runs inside a child process started by helper(): code that must not run in
// the test process itself.
func runHelper(name string, args []string) int {
	switch name {
	default:
		fmt.Fprintln(os.Stderr, "unknown helper", name)
		return 2
	}
}
