// Package qemuguest holds what the qemu guest harnesses (xfrmguest, armguest)
// share: the initramfs a test adds its own files to, and, in apt.sh, the
// shell functions their build scripts use to reach Debian's packages of
// another release or architecture.
package qemuguest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// AppendFiles writes, in dir, the image's initramfs followed by a second
// gzip-compressed newc archive holding files (guest path -> file here,
// each made executable), and returns its path. The kernel unpacks
// concatenated archives in order, so the second adds to the first.
func AppendFiles(ctx context.Context, initrd string, files map[string]string, dir string) (string, error) {
	stage, err := os.MkdirTemp(dir, "files-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(stage)
	var names []string
	for guest, host := range files {
		if !filepath.IsAbs(guest) {
			return "", fmt.Errorf("qemuguest: guest path %q is not absolute", guest)
		}
		rel := strings.TrimPrefix(filepath.Clean(guest), "/")
		dst := filepath.Join(stage, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", err
		}
		if err := copyFile(dst, host); err != nil {
			return "", fmt.Errorf("qemuguest: %s for the guest: %w", host, err)
		}
		// cpio wants every directory on the way listed before its files.
		for d := filepath.Dir(rel); d != "."; d = filepath.Dir(d) {
			names = append(names, d)
		}
		names = append(names, rel)
	}
	sort.Strings(names)
	names = dedup(names)

	out := filepath.Join(dir, "initrd-with-files.gz")
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	defer f.Close()
	base, err := os.Open(initrd)
	if err != nil {
		return "", err
	}
	defer base.Close()
	if _, err := io.Copy(f, base); err != nil {
		return "", err
	}
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, "sh", "-c", "cpio -o -H newc --quiet | gzip -1")
	cmd.Dir = stage
	cmd.Stdin = strings.NewReader(strings.Join(names, "\n") + "\n")
	cmd.Stdout, cmd.Stderr = f, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("qemuguest: cpio of the extra files: %w: %s", err, stderr.String())
	}
	return out, f.Close()
}

// copyFile copies src to dst, mode 0755.
func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// dedup removes adjacent duplicates from a sorted slice.
func dedup(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
