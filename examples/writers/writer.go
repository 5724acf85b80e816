// Writer side in Go with pgx v5 (`go get github.com/jackc/pgx/v5`): the business row and its outbox
// row in one transaction. Run: go run writer.go POSTGRES_URL ARCHIVE_ID JOB_ID ORG_ID
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
)

type tupleKey struct {
	User     string `json:"user"`
	Relation string `json:"relation"`
	Object   string `json:"object"`
}

type payload struct {
	Writes  []tupleKey `json:"writes,omitempty"`
	Deletes []tupleKey `json:"deletes,omitempty"`
}

func main() {
	url, archiveID, jobID, orgID := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close(ctx)

	// --- shown in docs/writing.md ---
	var outboxID int64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO archives (id, name) VALUES ($1, $2)", archiveID, "go"); err != nil {
			return err
		}
		// pgx encodes a struct given for a jsonb parameter as JSON.
		return tx.QueryRow(ctx, "INSERT INTO fga_outbox (payload) VALUES ($1) RETURNING id", payload{
			Writes: []tupleKey{
				{User: "capture_job:" + jobID, Relation: "parent", Object: "archive:" + archiveID},
				{User: "organization:" + orgID, Relation: "parent", Object: "capture_job:" + jobID},
			},
		}).Scan(&outboxID)
	})
	// --- end ---
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(outboxID)
}
