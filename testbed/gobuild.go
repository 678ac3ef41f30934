package testbed

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// GoBuild builds the package pkg (an import path such as
// "github.com/espd/espd/cmd/espd") into the binary out, within five
// minutes, with the go command on PATH or the running toolchain's, in
// BuildEnv. The error carries the compiler's output.
func GoBuild(out, pkg string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		// A test binary runs where it was built: the root it was
		// built with holds its go command.
		//lint:ignore SA1019 the build-time root is the one wanted here
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, "build", "-o", out, pkg)
	cmd.Env = BuildEnv()
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build -o %s %s: %w\n%s", out, pkg, err, strings.TrimSpace(string(b)))
	}
	return nil
}

// SecretExperiment is the Go experiment espd is built with: runtime/secret
// erases the key material that its stack frames, registers and freed heap
// objects held (crypto.DoSecret, docs/safety.md).
const SecretExperiment = "runtimesecret"

// BuildEnv is this process's environment with SecretExperiment added to
// GOEXPERIMENT, the environment every espd build (tests, the benchmark
// harness) uses, whatever the caller's.
func BuildEnv() []string {
	env := os.Environ()
	exps := []string{SecretExperiment}
	for i, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GOEXPERIMENT="); ok {
			for _, e := range strings.Split(v, ",") {
				if e != "" && e != SecretExperiment {
					exps = append(exps, e)
				}
			}
			env = append(env[:i:i], env[i+1:]...)
			break
		}
	}
	return append(env, "GOEXPERIMENT="+strings.Join(exps, ","))
}

// BuiltWithSecretErasure reports whether the Go binary at path was built
// with SecretExperiment (its build information says so).
func BuiltWithSecretErasure(path string) (bool, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return false, err
	}
	for _, s := range bi.Settings {
		if s.Key == "GOEXPERIMENT" && slices.Contains(strings.Split(s.Value, ","), SecretExperiment) {
			return true, nil
		}
	}
	return false, nil
}
