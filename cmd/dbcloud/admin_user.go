package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"dbcloud/cloud"

	"dbcloud/identity"
)

// runAdminUser runs `dbcloud admin user VERB`: the operator's way to make
// people before any of them can sign in to the console.
func runAdminUser(ctx context.Context, name, verb string, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	var a adminCommand
	switch verb {
	case "create":
		var in cloud.NewUser
		var role string
		var fromStdin bool
		fs := newFlagSet(name, "Create a user. Without --password-stdin a password is generated and shown once.", stderr)
		a.flags(fs)
		fs.StringVar(&in.Email, "email", "", "e-mail address, the user's sign-in name (required)")
		fs.StringVar(&in.Name, "name", "", "display name (required)")
		fs.StringVar(&in.ProjectID, "project", "", "make the user a member of this project")
		fs.StringVar(&role, "role", "developer", "role in --project: viewer, developer, admin or owner")
		fs.BoolVar(&fromStdin, "password-stdin", false, "read the password from the first line of standard input")
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		if in.Email == "" || in.Name == "" {
			return errors.New("--email and --name are required")
		}
		if in.ProjectID != "" {
			r, err := identity.ParseRole(role)
			if err != nil {
				return err
			}
			in.Role = r
		}
		if fromStdin {
			line, err := bufio.NewReader(stdin).ReadString('\n')
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("read password: %w", err)
			}
			in.Password = strings.TrimRight(line, "\r\n")
		}
		return a.run(ctx, func(c *cloud.Cloud) error {
			u, pw, err := c.CreateUser(ctx, in)
			if err != nil {
				return err
			}
			out := map[string]string{"id": u.ID, "email": u.Email, "name": u.Name}
			if !fromStdin {
				out["password"] = pw
				return a.print(stdout, out, "id: %s\nemail: %s\npassword: %s\n", u.ID, u.Email, pw)
			}
			return a.print(stdout, out, "id: %s\nemail: %s\n", u.ID, u.Email)
		})
	case "list":
		fs := newFlagSet(name, "List every user.", stderr)
		a.flags(fs)
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		return a.run(ctx, func(c *cloud.Cloud) error {
			us, err := c.ListUsersAdmin(ctx)
			if err != nil {
				return err
			}
			if a.json {
				return json.NewEncoder(stdout).Encode(us)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tEMAIL\tNAME\tDISABLED")
			for _, u := range us {
				disabled := "-"
				if u.Disabled != nil {
					disabled = u.Disabled.Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", u.ID, u.Email, u.Name, disabled)
			}
			return tw.Flush()
		})
	case "disable":
		var email string
		fs := newFlagSet(name, "Disable a user: sign-in, OAuth tokens, console sessions and the user's API keys stop at once.", stderr)
		a.flags(fs)
		fs.StringVar(&email, "email", "", "the user's e-mail address (required)")
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		if email == "" {
			return errors.New("--email is required")
		}
		return a.run(ctx, func(c *cloud.Cloud) error {
			if err := c.DisableUser(ctx, email); err != nil {
				return err
			}
			return a.print(stdout, map[string]string{"email": email, "status": "disabled"}, "disabled %s\n", email)
		})
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown admin command %q", "user "+verb)
}
