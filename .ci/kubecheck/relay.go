package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// relaySettings: the environment variables the binary reads, from clap's `env = "..."` in src/
// (as .ci/check-deploy reads them for deploy/env.example), and RUST_LOG.
func relaySettings(src string) (map[string]bool, error) {
	envAttr := regexp.MustCompile(`\benv\s*=\s*"([A-Z][A-Z0-9_]*)"`)
	settings := map[string]bool{"RUST_LOG": true}
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".rs") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range envAttr.FindAllSubmatch(data, -1) {
			settings[string(m[1])] = true
		}
		return nil
	})
	if err == nil && len(settings) < 10 {
		err = fmt.Errorf("found only %d settings in src/: has the command line moved?", len(settings))
	}
	return settings, err
}

// relayCommands: the subcommands of `fga-relay`, from the variants of cli.rs's `enum Command`
// (clap names each after its variant, in lower case).
func relayCommands(cli string) (map[string]bool, error) {
	data, err := os.ReadFile(cli)
	if err != nil {
		return nil, err
	}
	variant := regexp.MustCompile(`(?m)^\s*([A-Z][A-Za-z]*)\(commands::[A-Za-z]+\),?\s*$`)
	commands := map[string]bool{}
	for _, m := range variant.FindAllSubmatch(data, -1) {
		name := []rune(string(m[1]))
		name[0] = unicode.ToLower(name[0])
		commands[string(name)] = true
	}
	if len(commands) < 5 {
		return commands, fmt.Errorf("found only %d commands in enum Command: has it moved?", len(commands))
	}
	return commands, nil
}
