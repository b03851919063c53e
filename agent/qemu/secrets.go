package qemu

import (
	"errors"
	"regexp"
)

// quotedValue matches the snippets of a document YAML errors quote
// ("cannot unmarshal !!str `passw...`").
var quotedValue = regexp.MustCompile("`[^`]*`|\"[^\"]*\"|'[^']*'")

// secretYAMLError is a YAML error about a secret document (user-data)
// with every quoted snippet of the document taken out, so the error, which
// reaches lastError and the log, keeps the line and the kind of fault and
// no part of the secret.
func secretYAMLError(err error) error {
	return errors.New(quotedValue.ReplaceAllString(err.Error(), "(value)"))
}
