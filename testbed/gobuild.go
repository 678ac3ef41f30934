package testbed

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// GoBuild builds the package pkg (an import path such as
// "github.com/espd/espd/cmd/espd") into the binary out, within five
// minutes, with the go command on PATH or the running toolchain's. The
// error carries the compiler's output.
func GoBuild(out, pkg string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := exec.CommandContext(ctx, gobin, "build", "-o", out, pkg).CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build -o %s %s: %w\n%s", out, pkg, err, strings.TrimSpace(string(b)))
	}
	return nil
}
