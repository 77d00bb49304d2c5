// Command dbcloud serves the database cloud API and administers its store.
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

	"dbcloud/runtime/local/proxy"
)

const usage = `dbcloud: a self-hosted database cloud.

Usage:
  dbcloud serve [flags]                   run the API server (HTTPS)
  dbcloud admin project create --name N   create a project
  dbcloud admin project list              list projects
  dbcloud admin project set-quota --project ID [--instances N --cpu-millis N --memory-gbs N --storage-gbs N | --default]
                                          set a project's resource quota
  dbcloud admin key create --project ID --name N [--role R]   issue an API key (owner unless --role)
  dbcloud admin key list --project ID     list a project's API keys
  dbcloud admin key revoke --access-key K revoke an API key
  dbcloud admin service list --project ID list a project's services
  dbcloud admin service show --project ID --id SERVICE
                                          show a service and its connection string
  dbcloud admin service stop-all          stop every running service (data kept)
  dbcloud admin teardown                  delete every service and stop everything dbcloud
                                          started (after stopping dbcloud serve)
  dbcloud admin user create --email E --name N [--project ID --role R] [--password-stdin]
                                          create a user (a generated password is shown once)
  dbcloud admin user list                 list users
  dbcloud admin user disable --email E    stop a user's sign-in, tokens and keys

Run "dbcloud COMMAND --help" for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "dbcloud:", err)
		os.Exit(1)
	}
}

// Run executes the command line args; tests call it in-process.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "serve":
		m := NewMain(stderr)
		if err := m.ParseFlags(args[1:]); err != nil {
			return err
		}
		if err := m.Run(ctx); err != nil {
			m.Close()
			return err
		}
		<-ctx.Done()
		return m.Close()
	case "admin":
		return runAdmin(ctx, args[1:], stdout, stderr)
	case proxy.Command:
		// Hidden: a service's endpoint proxy, started by the local runtime.
		return proxy.Run(ctx, args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
