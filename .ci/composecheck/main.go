// composecheck loads the repository's compose file as `docker compose config` does, with
// compose-go, the library Docker Compose itself loads compose files with: the file found by
// Compose's own rules (docker-compose.yml, with docker-compose.override.yml where there is one),
// `.env` beside it, interpolation, `x-` anchors and merge keys, the Compose Specification's
// schema, normalisation and the consistency checks (services, networks, volumes, secrets and
// configs that are named but not declared). Any error fails the check, and so does any warning
// Compose would print (a variable that is not set, an obsolete attribute): both mean the file does
// not say what it seems to.
//
// The shell's environment is left out on purpose: the file must load the same on every machine,
// with only what `.env` gives it. On success it prints the normalised project's services.
//
// Usage: composecheck DIR (the directory holding the compose file; "." by default).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/sirupsen/logrus"
)

// warnings keeps what compose-go warns about, which Compose would print and go on.
type warnings struct{ said []string }

func (w *warnings) Levels() []logrus.Level {
	return []logrus.Level{logrus.PanicLevel, logrus.FatalLevel, logrus.ErrorLevel, logrus.WarnLevel}
}

// Fire keeps each warning once (one unset variable is said wherever it is used).
func (w *warnings) Fire(e *logrus.Entry) error {
	for _, s := range w.said {
		if s == e.Message {
			return nil
		}
	}
	w.said = append(w.said, e.Message)
	return nil
}

func main() {
	dir := "."
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		fail(err)
	}
	said := &warnings{}
	logrus.AddHook(said)
	// Said once, below, with the others; not twice on stderr.
	logrus.SetOutput(nopWriter{})

	options, err := cli.NewProjectOptions(nil,
		cli.WithWorkingDirectory(dir),
		cli.WithDefaultConfigPath,
		cli.WithEnvFiles(),
		cli.WithDotEnv,
	)
	if err != nil {
		fail(err)
	}
	rel := func(path string) string {
		if r, err := filepath.Rel(dir, path); err == nil {
			return r
		}
		return path
	}
	project, err := options.LoadProject(context.Background())
	if err != nil {
		fail(err)
	}
	if len(said.said) > 0 {
		for _, w := range said.said {
			fmt.Fprintf(os.Stderr, "  warning: %s\n", w)
		}
		fmt.Fprintf(os.Stderr, "composecheck: compose-go loads %s with the warnings above\n",
			files(project, rel))
		os.Exit(1)
	}
	if len(project.Services) == 0 {
		fail(fmt.Errorf("no services in %s", files(project, rel)))
	}
	fmt.Printf("composecheck: project %s, %d services, from %s\n",
		project.Name, len(project.Services), files(project, rel))
	names := make([]string, 0, len(project.Services))
	for name := range project.Services {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Printf("  %s\n", describe(project.Services[name], rel))
	}
}

// describe says what Compose will run for a service, once normalised: what it runs, what it
// waits for, and what it publishes.
func describe(s types.ServiceConfig, rel func(string) string) string {
	parts := []string{s.Name + ":"}
	if s.Build != nil {
		parts = append(parts, "build "+rel(s.Build.Context)+" ("+s.Build.Dockerfile+")")
	}
	if s.Image != "" {
		parts = append(parts, "image "+s.Image)
	}
	if len(s.Entrypoint) > 0 {
		parts = append(parts, fmt.Sprintf("entrypoint %q", []string(s.Entrypoint)))
	}
	if len(s.Command) > 0 {
		parts = append(parts, fmt.Sprintf("command %q", []string(s.Command)))
	}
	if len(s.DependsOn) > 0 {
		deps := make([]string, 0, len(s.DependsOn))
		for dep, d := range s.DependsOn {
			deps = append(deps, dep+" "+d.Condition)
		}
		sort.Strings(deps)
		parts = append(parts, "after "+strings.Join(deps, ", "))
	}
	for _, p := range s.Ports {
		parts = append(parts, fmt.Sprintf("publishes %s:%s->%d/%s", p.HostIP, p.Published, p.Target, p.Protocol))
	}
	if len(s.Environment) > 0 {
		keys := make([]string, 0, len(s.Environment))
		for k := range s.Environment {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		// Names only: values may be secrets in a compose file of someone's own.
		parts = append(parts, "env "+strings.Join(keys, ","))
	}
	return strings.Join(parts, " ")
}

// files names the files the project was loaded from, relative to its directory.
func files(p *types.Project, rel func(string) string) string {
	names := make([]string, 0, len(p.ComposeFiles))
	for _, f := range p.ComposeFiles {
		names = append(names, rel(f))
	}
	return strings.Join(names, ", ")
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

func fail(err error) {
	fmt.Fprintf(os.Stderr, "  %v\ncomposecheck: compose-go does not load the compose file\n", err)
	os.Exit(1)
}
