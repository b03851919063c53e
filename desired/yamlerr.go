package desired

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
)

var yamlErrLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlParserContexts maps each problem libyaml's parser (not its scanner)
// reports to the construct its error context names, or "" when the
// problem has no context (parserc.go, yaml_parser_set_parser_error*).
var yamlParserContexts = map[string]string{
	"did not find expected <stream-start>":   "",
	"did not find expected <document start>": "",
	"found duplicate %YAML directive":        "",
	"found incompatible YAML document":       "",
	"found duplicate %TAG directive":         "",
	"found undefined tag handle":             "the node",
	"did not find expected node content":     "the node",
	"did not find expected '-' indicator":    "the block sequence",
	"did not find expected key":              "the block mapping",
	"did not find expected ',' or ']'":       "the flow sequence [",
	"did not find expected ',' or '}'":       "the flow mapping {",
}

// yamlErrorAt splits the message of a go.yaml.in/yaml/v3 syntax error in
// doc into the 1-based line of doc it concerns (0 when it names none) and
// the problem.
//
// The library numbers a scanner error's line from 1 but a parser error's
// from 0, and for a parser error names the line where the enclosing
// construct starts (libyaml's context mark), or the problem's own line when
// that construct starts on the first line; so a parser error's line is
// moved down by one, kept within doc (the end of the stream lies past a last
// line without a newline), and its problem names the construct.
func yamlErrorAt(doc []byte, msg string) (line int, problem string) {
	problem = strings.TrimPrefix(msg, "yaml: ")
	if m := yamlErrLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		problem = m[2]
	}
	construct, parser := yamlParserContexts[problem]
	if !parser {
		return line, problem
	}
	// A parser error on the first line (line 0 to the library) has no
	// "line N:" prefix at all.
	line = min(line+1, max(lineCount(doc), 1))
	if construct != "" {
		problem += " (in " + construct + " that starts on this line or above)"
	}
	return line, problem
}

// lineCount is the number of lines of doc, a last one without a newline
// included.
func lineCount(doc []byte) int {
	n := bytes.Count(doc, []byte{'\n'})
	if len(doc) > 0 && doc[len(doc)-1] != '\n' {
		n++
	}
	return n
}
