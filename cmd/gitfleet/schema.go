package main

import (
	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/desired"
)

func newSchemaCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "schema",
		Short: "Print the JSON Schema (draft 2020-12) of the object files, for editors",
		Long: `Schema prints a JSON Schema (draft 2020-12) of one object file (a VM, a
Volume or a Host) to standard output. Save it in the fleet repository and
point each file at it, for completion and checks as you type, with a first
line such as:

  # yaml-language-server: $schema=../.gitfleet/schema.json

The schema checks each object on its own; gitfleet validate also checks the
objects against each other.`,
		Args: noArgs("schema"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := cmd.OutOrStdout().Write(desired.JSONSchema())
			return err
		},
	}
}
