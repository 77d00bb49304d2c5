package local

import (
	"strings"
	"testing"
)

// TestPGUpgradeReason: what a user reads of a refused pg_upgrade names the
// check and pg_upgrade's explanation, and no host path.
func TestPGUpgradeReason(t *testing.T) {
	out := "Performing Consistency Checks\n-----------------------------\n" +
		"Checking cluster versions                                     ok\r\n" +
		"Checking database user is the install user                    ok\n" +
		"Checking data type usage                                      \n" +
		"Data type checks failed: Your installation contains one of the reg* data types in user tables.\n" +
		"These data types reference system OIDs that are not preserved by\npg_upgrade, so this cluster cannot currently be upgraded.\n" +
		"A list of the problem columns is in the file:\n    /srv/dbcloud/services/x/upgrade/new/pg_upgrade_output.d/t/tables_using_reg.txt\n\n" +
		"Failure, exiting\n"
	got := pgUpgradeReason(out)
	if !strings.HasPrefix(got, "Checking data type usage: Data type checks failed: Your installation contains one of the reg* data types") ||
		!strings.Contains(got, "cannot currently be upgraded.") || strings.Contains(got, "/srv") || strings.Contains(got, "Failure") {
		t.Errorf("reason %q", got)
	}
}
