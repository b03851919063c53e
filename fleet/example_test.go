package fleet_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/gitfleet/gitfleet/fleet"
)

// A controller over a local bare repository: one pass, as `gitfleet
// controller --once` runs it. A test moves Clock to drive the abandoned
// sweep; SummaryInterval -1 writes README.md on every change.
func Example() {
	ctx := context.Background()
	c, err := fleet.New(fleet.Config{
		URL:             "/srv/fleet.git",
		Path:            "fleet",
		AbandonGrace:    15 * time.Minute,
		SummaryInterval: -1,
	})
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.Pass(ctx)
	switch {
	case err != nil:
		log.Fatal(err) // git failed; Run would retry
	case res.Rejected != nil:
		log.Printf("desired state at %s rejected, the last good snapshots stay: %v", res.Head, res.Rejected)
	default:
		fmt.Println("published epochs:", res.Published, "pending deletes:", res.Pending)
	}
}
