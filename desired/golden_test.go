package desired

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/gitfleet/gitfleet/testsupport/golden"
)

// TestLoadGolden loads each fleet under testdata/load/ and pins its whole
// error output in testdata/load/<name>.golden.
func TestLoadGolden(t *testing.T) {
	for _, name := range []string{"cross", "networks", "nics", "nicsnet", "partial", "statics", "tree", "userdata"} {
		t.Run(name, func(t *testing.T) {
			_, err := LoadDir(filepath.Join("testdata", "load", name))
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("err = %v; want an ErrorList", err)
			}
			golden.Check(t, "load/"+name+".golden", []byte(list.Error()+"\n"))
		})
	}
}
