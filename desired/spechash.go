package desired

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// SpecHash returns the lowercase hex sha256 of spec's canonical JSON: the
// encoding/json encoding of VMSpec (fields in declaration order, empty
// optional fields left out, map keys sorted). Equal specs hash equally; a
// change to any field changes the hash.
func SpecHash(spec VMSpec) Hash {
	b, err := json.Marshal(spec)
	if err != nil {
		// VMSpec holds only strings, ints, bools, slices and maps with string
		// keys: encoding cannot fail.
		panic(fmt.Sprintf("desired: encode VMSpec: %v", err))
	}
	sum := sha256.Sum256(b)
	return Hash(hex.EncodeToString(sum[:]))
}
