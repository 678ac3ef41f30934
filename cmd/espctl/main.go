// Command espctl configures espd over its control socket: states (SAs),
// policies, SPI allocation, counters, events and a gateway pair's role.
//
//	espctl [-s socket] [--json] sa add|update|del|get|list|flush [flags]
//	espctl [-s socket] [--json] policy add|update|del|get|list|flush [flags]
//	espctl [-s socket] [--json] spi alloc [--min SPI --max SPI]
//	espctl [-s socket] [--json] stats [--spi SPI --dst ADDR]
//	espctl [-s socket] [--json] monitor [--events KINDS] [--count N]
//	espctl [-s socket] [--json] pair role active|standby
//	espctl [-s socket] [--json] pair status
//
// Run "espctl sa add -h" and so on for the flags of each command.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/espd/espd/control"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the request failed
	exitUsage = 2 // bad command line
)

const usage = `usage: espctl [-s socket] [--json] [--timeout d] <command>

commands:
  sa add      --spi SPI --src ADDR --dst ADDR --dir in|out --enc ALG [--auth ALG]
              --enc-key-file PATH|- [--integ-key-file PATH|-] [state options]
  sa update   --spi SPI --dst ADDR [--new-src ADDR] [--new-dst ADDR] [state options]
  sa del      --spi SPI --dst ADDR
  sa get      --spi SPI --dst ADDR
  sa list
  sa flush
  policy add|update  --dir in|out|fwd [--src PREFIX] [--dst PREFIX] [--proto P]
              [--sport R] [--dport R] [--action protect|bypass|drop] [--priority N]
              [--reqid N] [--tmpl-src ADDR] [--tmpl-dst ADDR] [--mode tunnel|transport]
              [--if-id N]
  policy del|get     --dir in|out|fwd [selector flags]
  policy list
  policy flush
  spi alloc   [--min SPI] [--max SPI]
  stats       [--spi SPI --dst ADDR]
  monitor     [--events soft-expire,hard-expire,acquire,mapping] [--count N]
  pair role   active|standby   (set this espd's role in its gateway pair)
  pair status

"espctl sa add -h" lists the state options (mode tunnel or transport, replay window,
ESN, UDP encapsulation, reqid, selectors, lifetimes, outer TTL/DSCP/ECN/DF, TFC);
espd gives every option not given its default (tunnel mode, ...). Keys are read in hex from a file that only its owner (and
group) can read, or from standard input with "-" (two lines, encryption key first,
when both are "-"); they are never taken on the command line.
`

// app holds the global options of one run.
type app struct {
	socket  string
	json    bool
	timeout time.Duration
	stdin   io.Reader // keys given as "-"
	stdout  io.Writer
	stderr  io.Writer
}

// usageError is a bad command line: exit code 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// run executes one command line and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("espctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	fs.StringVar(&a.socket, "s", control.DefaultSocketPath, "control socket")
	fs.StringVar(&a.socket, "socket", control.DefaultSocketPath, "control socket")
	fs.BoolVar(&a.json, "json", false, "JSON output")
	fs.DurationVar(&a.timeout, "timeout", 10*time.Second, "time limit for each request")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	err := a.dispatch(ctx, rest)
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	fmt.Fprintf(stderr, "espctl: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitError
}

// command is one "object verb" of the command line.
type command func(a *app, ctx context.Context, args []string) error

var commands = map[string]map[string]command{
	"sa": {
		"add": saAdd, "update": saUpdate, "del": saDel, "delete": saDel,
		"get": saGet, "list": saList, "show": saList, "flush": saFlush,
	},
	"policy": {
		"add": policyAdd, "update": policyUpdate, "del": policyDel, "delete": policyDel,
		"get": policyGet, "list": policyList, "show": policyList, "flush": policyFlush,
	},
	"spi":  {"alloc": spiAlloc},
	"pair": {"role": pairRole, "status": pairStatus},
}

func (a *app) dispatch(ctx context.Context, args []string) error {
	switch args[0] {
	case "stats":
		return stats(a, ctx, args[1:])
	case "monitor":
		return monitor(a, ctx, args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(a.stdout, usage)
		return nil
	}
	verbs, ok := commands[args[0]]
	if !ok {
		return usagef("unknown command %q (sa, policy, spi, stats, monitor, pair)", args[0])
	}
	if len(args) < 2 {
		return usagef("%s needs a subcommand (%s)", args[0], verbList(verbs))
	}
	cmd, ok := verbs[args[1]]
	if !ok {
		return usagef("unknown command %q %q (%s)", args[0], args[1], verbList(verbs))
	}
	if err := cmd(a, ctx, args[2:]); err != nil {
		var ue usageError
		if errors.As(err, &ue) || errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%s %s: %w", args[0], args[1], err)
	}
	return nil
}

func verbList(verbs map[string]command) string {
	for _, order := range [][]string{{"add", "update", "del", "get", "list", "flush"}, {"alloc"}, {"role", "status"}} {
		if _, ok := verbs[order[0]]; ok {
			s := ""
			for i, v := range order {
				if i > 0 {
					s += ", "
				}
				s += v
			}
			return s
		}
	}
	return ""
}

// flagSet prepares a command's flag set: errors to stderr, --json too.
func (a *app) flagSet(fs *flag.FlagSet) *flag.FlagSet {
	fs.SetOutput(a.stderr)
	fs.BoolVar(&a.json, "json", a.json, "JSON output")
	return fs
}

// parse parses a command's flags, turning flag errors into usage errors.
func (a *app) parse(fs *flag.FlagSet, parse func([]string) error, args []string) error {
	a.flagSet(fs)
	if err := parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	return nil
}

// cmdFlags is a command's flag set and the flags given on its command line.
type cmdFlags struct {
	fs  *flag.FlagSet
	set map[string]bool
}

// parse parses args, every one of which must be a flag, and records in
// f.set the flags given.
func (f *cmdFlags) parse(args []string) error {
	if err := f.fs.Parse(args); err != nil {
		return err
	}
	if f.fs.NArg() != 0 {
		return fmt.Errorf("unexpected argument %q", f.fs.Arg(0))
	}
	f.set = map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	return nil
}

// noFlags parses the flags of a command that takes none but --json.
func (a *app) noFlags(name string, args []string) error {
	f := cmdFlags{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	return a.parse(f.fs, f.parse, args)
}

// client dials the socket.
func (a *app) client(ctx context.Context) (*control.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	c, err := control.Dial(dctx, a.socket)
	if err != nil {
		return nil, fmt.Errorf("connecting to espd at %s: %w", a.socket, err)
	}
	return c, nil
}

// request dials, runs f with a per-request deadline, and closes.
func (a *app) request(ctx context.Context, f func(ctx context.Context, c *control.Client) error) error {
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	return f(rctx, c)
}
