package desired

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/mail"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// User-data is checked the way cloud-init reads it, so that `validate` and
// `plan` refuse what cloud-init would not run, and nothing else. The rules
// follow cloud-init's own source: user_data.py (convert_string,
// _process_msg, _explode_archive), handlers/__init__.py (INCLUSION_TYPES_MAP,
// type_from_starts_with) and util.load_yaml (PyYAML's safe loader, YAML 1.1).
// gitfleet never rewrites user-data: the agent writes it to the seed byte for
// byte, so what is checked here is what the guest reads.

// userDataPrefixes maps how a document starts to the MIME type cloud-init
// gives it (handlers.INCLUSION_TYPES_MAP), longest prefix first as
// cloud-init searches them.
var userDataPrefixes = func() [][2]string {
	m := map[string]string{
		"#include":                        "text/x-include-url",
		"#include-once":                   "text/x-include-once-url",
		"#!":                              "text/x-shellscript",
		"#cloud-config":                   "text/cloud-config",
		"#part-handler":                   "text/part-handler",
		"#cloud-boothook":                 "text/cloud-boothook",
		"#cloud-config-archive":           "text/cloud-config-archive",
		"#cloud-config-jsonp":             "text/cloud-config-jsonp",
		"## template: jinja":              "text/jinja2",
		"text/x-shellscript-per-boot":     "text/x-shellscript-per-boot",
		"text/x-shellscript-per-instance": "text/x-shellscript-per-instance",
		"text/x-shellscript-per-once":     "text/x-shellscript-per-once",
	}
	out := make([][2]string, 0, len(m))
	for p, t := range m {
		out = append(out, [2]string{p, t})
	}
	sort.SliceStable(out, func(i, j int) bool {
		if len(out[i][0]) != len(out[j][0]) {
			return len(out[i][0]) > len(out[j][0])
		}
		return out[i][0] < out[j][0]
	})
	return out
}()

// UserDataType is the MIME type cloud-init gives a user-data document by how
// it starts, such as "text/cloud-config" for "#cloud-config" and
// "text/cloud-config-archive" for "#cloud-config-archive": the longest
// known prefix, compared case-insensitively after leading white space
// (cloud-init's type_from_starts_with). It is "" when no prefix matches or
// doc is not UTF-8; cloud-init then ignores the document. A MIME message or
// a gzip stream is not recognised here: see CheckUserData.
func UserDataType(doc []byte) string {
	if !utf8.Valid(doc) {
		return ""
	}
	lc := strings.Map(pythonLower, strings.TrimLeftFunc(string(doc), pythonIsSpace))
	for _, p := range userDataPrefixes {
		if strings.HasPrefix(lc, p[0]) {
			return p[1]
		}
	}
	return ""
}

// pythonIsSpace is Python's str.isspace, which str.lstrip uses: Go's
// unicode.IsSpace and the file, group, record and unit separators
// U+001C..U+001F, which Python counts as white space and Go does not.
func pythonIsSpace(r rune) bool {
	return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f
}

// pythonLower lower-cases r as Python's str.lower does for matching an
// ASCII prefix: U+0130 (capital I with dot above) becomes "i\u0307" in
// Python, never a plain "i", so it is kept as it is; every other rune
// maps as in unicode.ToLower.
func pythonLower(r rune) rune {
	if r == '\u0130' {
		return r
	}
	return unicode.ToLower(r)
}

// UserDataProblem is one reason cloud-init would not run a user-data
// document as written, or would read it otherwise than it reads. Line is
// the 1-based line in the document that was checked, 0 when the problem has
// no line there (inside a gzip stream or a MIME part, whose own line Msg
// names).
type UserDataProblem struct {
	Line int
	Msg  string
}

// maxUserData bounds, in bytes, everything CheckUserData decompresses in
// one document, the gzip stream and all gzip MIME parts together
// (cloud-init's seeds are small; this stops a gzip bomb, and a MIME message
// of many small ones, from holding up validate and the controller).
const maxUserData = 4 << 20

// maxUserDataProblems bounds the problems CheckUserData reports for one
// document; a document with more gets one last problem saying so.
const maxUserDataProblems = 100

// CheckUserData checks a user-data document as cloud-init reads it:
//
//   - a gzip stream is decompressed first;
//   - a document with "mime-version:" in its first 4096 bytes is a MIME
//     message, walked part by part (base64 and quoted-printable decoded,
//     gzip parts decompressed, text/plain and text/x-shellscript parts typed
//     by how they start);
//   - anything else is typed by how it starts (UserDataType).
//
// A #cloud-config document or part must be one YAML 1.1 document whose root
// is a mapping (or empty); a repeated key is reported as an error, because
// cloud-init keeps the last one and drops the first without a word. A
// #cloud-config-archive must be a YAML list of strings or mappings, and its
// cloud-config entries are checked the same way. A document cloud-init
// recognises no type for is an error: cloud-init ignores it. Scripts,
// includes, boothooks, part handlers and jinja templates are not looked
// into. An empty document is valid. The problems come in document order.
func CheckUserData(doc []byte) []UserDataProblem {
	if len(doc) == 0 {
		return nil
	}
	budget := maxUserData
	var out []UserDataProblem
	switch raw, res := gunzip(doc, &budget); res {
	case gzipOK:
		out = checkUserDataText(raw, "gzip-compressed user-data: ", -1, &budget)
	case gzipTooBig:
		out = []UserDataProblem{{Msg: tooBigMsg("gzip-compressed user-data")}}
	default:
		out = checkUserDataText(doc, "", 0, &budget)
	}
	if len(out) > maxUserDataProblems {
		out = append(out[:maxUserDataProblems:maxUserDataProblems], UserDataProblem{Msg: fmt.Sprintf("more problems follow; only the first %d are listed", maxUserDataProblems)})
	}
	return out
}

func tooBigMsg(what string) string {
	return fmt.Sprintf("%s decompresses to more than %d bytes in all; gitfleet checks no larger user-data, write it uncompressed or smaller", what, maxUserData)
}

// checkUserDataText checks a document that is not compressed; offset is as
// for checkPart.
func checkUserDataText(doc []byte, where string, offset int, budget *int) []UserDataProblem {
	head := doc
	if len(head) > 4096 {
		head = head[:4096]
	}
	if bytes.Contains(bytes.ToLower(head), []byte("mime-version:")) {
		return checkMIME(doc, where, budget)
	}
	ctype := UserDataType(doc)
	if ctype == "" {
		return []UserDataProblem{{Line: max(offset+1, 0), Msg: where + "cloud-init recognises no format here and would ignore it: user-data starts with #cloud-config, #cloud-config-archive, #!, #include, #cloud-boothook, #part-handler or \"## template: jinja\", or is a MIME message or gzip stream"}}
	}
	return checkPart(ctype, doc, where, offset)
}

// checkPart checks one typed document; line offset maps its lines to the
// checked document's (0 when its first line is line 1; -1 when its lines
// do not map, and Msg names them).
func checkPart(ctype string, doc []byte, where string, offset int) []UserDataProblem {
	var probs []yamlProblem
	switch ctype {
	case "text/cloud-config":
		probs = checkCloudConfig(doc)
	case "text/cloud-config-archive":
		return checkArchive(doc, where, offset)
	default:
		return nil
	}
	return placed(probs, where, offset)
}

// placed turns problems with lines in a part into problems of the checked
// document.
func placed(probs []yamlProblem, where string, offset int) []UserDataProblem {
	out := make([]UserDataProblem, 0, len(probs))
	for _, p := range probs {
		u := UserDataProblem{Msg: where + p.msg}
		switch {
		case offset >= 0 && p.line > 0:
			u.Line = offset + p.line
		case p.line > 0:
			u.Msg = fmt.Sprintf("%sline %d: %s", where, p.line, p.msg)
		}
		out = append(out, u)
	}
	return out
}

// gzipResult says what gunzip made of a document.
type gzipResult int

const (
	gzipNot    gzipResult = iota // not a gzip stream, or a broken one
	gzipOK                       // decompressed
	gzipTooBig                   // decompresses to more than *budget bytes
)

// gunzip decompresses doc when it is a gzip stream (cloud-init's
// decomp_gzip), taking what it decompresses from *budget bytes.
func gunzip(doc []byte, budget *int) ([]byte, gzipResult) {
	if len(doc) < 2 || doc[0] != 0x1f || doc[1] != 0x8b {
		return nil, gzipNot
	}
	zr, err := gzip.NewReader(bytes.NewReader(doc))
	if err != nil {
		return nil, gzipNot
	}
	raw, err := io.ReadAll(io.LimitReader(zr, int64(*budget)+1))
	if len(raw) > *budget {
		*budget = 0
		return nil, gzipTooBig
	}
	if err != nil {
		return nil, gzipNot
	}
	*budget -= len(raw)
	return raw, gzipOK
}

// decompTypes are the MIME types whose parts cloud-init decompresses
// before typing them (user_data.DECOMP_TYPES).
var decompTypes = map[string]bool{
	"application/gzip": true, "application/gzip-compressed": true, "application/gzipped": true,
	"application/x-compress": true, "application/x-compressed": true, "application/x-gunzip": true,
	"application/x-gzip": true, "application/x-gzip-compressed": true,
}

// mimeHeaderLine is what Python's email feedparser takes for a header
// line (headerRE in email/feedparser.py); the first line that is neither
// this nor blank starts the body.
var mimeHeaderLine = regexp.MustCompile(`^(From |[\x21-\x39\x3b-\x7e]*:|[\t ])`)

// mimeHeaderSplit splits doc as Python's email parser does: header lines
// up to a blank line, or up to the first line that is not a header, which
// then starts the body (cloud-init's "#cloud-config" with "mime-version:"
// in a comment is such a message, all body, of type text/plain). It
// returns the document with a blank line between the two.
func mimeHeaderSplit(doc []byte) []byte {
	rest := doc
	var header []byte
	for len(rest) > 0 {
		line, after, _ := bytes.Cut(rest, []byte("\n"))
		if len(bytes.TrimRight(line, "\r")) == 0 {
			rest = after
			break
		}
		if !mimeHeaderLine.Match(line) {
			break
		}
		header = append(append(header, line...), '\n')
		rest = after
	}
	return append(append(header, '\n'), rest...)
}

// checkMIME walks a MIME message's parts as cloud-init's _process_msg
// does. A message Go's parser cannot read is not reported: Python's email
// parser is more lenient, and only what cloud-init refuses is an error.
func checkMIME(doc []byte, where string, budget *int) []UserDataProblem {
	msg, err := mail.ReadMessage(bytes.NewReader(mimeHeaderSplit(doc)))
	if err != nil {
		return nil
	}
	var out []UserDataProblem
	n := 0
	var walk func(h textprotoHeader, body io.Reader)
	walk = func(h textprotoHeader, body io.Reader) {
		ctype, params, err := mime.ParseMediaType(h.Get("Content-Type"))
		if err != nil {
			ctype = "text/plain"
		}
		if strings.HasPrefix(ctype, "multipart/") {
			mr := multipart.NewReader(body, params["boundary"])
			for {
				p, err := mr.NextRawPart()
				if err != nil {
					return
				}
				walk(textprotoHeader(p.Header), p)
			}
		}
		n++
		label := fmt.Sprintf("%sMIME part %d (%s)", where, n, ctype)
		if _, disp, err := mime.ParseMediaType(h.Get("Content-Disposition")); err == nil && disp["filename"] != "" {
			label = fmt.Sprintf("%sMIME part %d (%s, %s)", where, n, ctype, disp["filename"])
		}
		payload, err := decodeTransfer(h.Get("Content-Transfer-Encoding"), body)
		if err != nil {
			return
		}
		if decompTypes[ctype] {
			raw, res := gunzip(payload, budget)
			if res == gzipTooBig {
				out = append(out, UserDataProblem{Msg: tooBigMsg(label)})
				return
			}
			if res != gzipOK {
				return // cloud-init logs the failure and skips the part
			}
			payload, ctype = raw, "text/plain"
		}
		switch ctype {
		case "text/plain", "text/x-not-multipart", "text/x-shellscript":
			if t := UserDataType(payload); t != "" {
				ctype = t
			} else if ctype != "text/x-shellscript" {
				out = append(out, UserDataProblem{Msg: label + ": starts with no format cloud-init knows (#cloud-config, #!, ...); cloud-init ignores this part"})
				return
			}
		}
		out = append(out, checkPart(ctype, payload, label+": ", -1)...)
	}
	walk(textprotoHeader(msg.Header), msg.Body)
	return out
}

// textprotoHeader is the one method both mail.Header and
// textproto.MIMEHeader offer that checkMIME needs.
type textprotoHeader map[string][]string

func (h textprotoHeader) Get(key string) string {
	return mail.Header(h).Get(key)
}

// decodeTransfer undoes a part's Content-Transfer-Encoding as Python's
// get_payload(decode=True) does.
func decodeTransfer(cte string, body io.Reader) ([]byte, error) {
	r := io.LimitReader(body, maxUserData+1)
	switch strings.ToLower(strings.TrimSpace(cte)) {
	case "base64":
		raw, err := io.ReadAll(r)
		if err != nil {
			return nil, err
		}
		return base64.StdEncoding.DecodeString(strings.Map(func(c rune) rune {
			if unicode.IsSpace(c) {
				return -1
			}
			return c
		}, string(raw)))
	case "quoted-printable":
		return io.ReadAll(quotedprintable.NewReader(r))
	}
	return io.ReadAll(r)
}

// checkArchive checks a #cloud-config-archive as _explode_archive reads it:
// a YAML list whose entries are strings (content) or mappings with content
// and an optional type; an entry without a type is typed by how its content
// starts, text/cloud-config when nothing matches.
func checkArchive(doc []byte, where string, offset int) []UserDataProblem {
	root, probs := parseYAML11(doc)
	out := placed(probs, where, offset)
	if root == nil {
		return out
	}
	if root.Kind != yaml.SequenceNode {
		if isYAMLNull(root) {
			return out
		}
		return append(out, placed([]yamlProblem{{line: root.Line, msg: fmt.Sprintf("#cloud-config-archive is %s, not a list of parts: cloud-init ignores it", yamlKind(root))}}, where, offset)...)
	}
	for i, ent := range root.Content {
		label := fmt.Sprintf("%sarchive entry %d: ", where, i+1)
		var content, typ *yaml.Node
		switch {
		case ent.Kind == yaml.ScalarNode && pyyamlTag(ent) == "!!str":
			content = ent
		case ent.Kind == yaml.ScalarNode && pyyamlTag(ent) == "!!null":
			continue // cloud-init skips it; nothing was meant
		case ent.Kind == yaml.MappingNode:
			for j := 0; j+1 < len(ent.Content); j += 2 {
				switch ent.Content[j].Value {
				case "content":
					content = ent.Content[j+1]
				case "type":
					typ = ent.Content[j+1]
				}
			}
		default:
			out = append(out, placed([]yamlProblem{{line: ent.Line, msg: fmt.Sprintf("is %s, not a string or a mapping: cloud-init skips it", yamlKind(ent))}}, label, offset)...)
			continue
		}
		ctype := ""
		if typ != nil {
			t := pyyamlTag(typ)
			switch {
			case typ.Kind != yaml.ScalarNode || t != "!!str" && t != "!!null" && !(t == "!!bool" && yaml11False(typ.Value)) && !(t == "!!int" && isZero(typ.Value)):
				out = append(out, placed([]yamlProblem{{line: typ.Line, msg: fmt.Sprintf("type is %s, not a MIME type such as text/cloud-config: cloud-init fails on it and runs none of this user-data", yamlKind(typ))}}, label, offset)...)
				continue
			case t == "!!str" && typ.Value != "" && !strings.Contains(typ.Value, "/"):
				out = append(out, placed([]yamlProblem{{line: typ.Line, msg: fmt.Sprintf("type %q is not a MIME type such as text/cloud-config (no \"/\"): cloud-init fails on it and runs none of this user-data", typ.Value)}}, label, offset)...)
				continue
			case t == "!!str":
				ctype = typ.Value
			}
		}
		if content == nil || content.Kind != yaml.ScalarNode {
			continue
		}
		if ctype == "" {
			ctype = UserDataType([]byte(content.Value))
		}
		if ctype == "" {
			ctype = "text/cloud-config"
		}
		// A literal block's line k is line content.Line+k of the archive.
		sub := -1
		if offset >= 0 && content.Style&yaml.LiteralStyle != 0 {
			sub = offset + content.Line
		}
		if ctype == "text/cloud-config" {
			out = append(out, placed(checkCloudConfig([]byte(content.Value)), label, sub)...)
		}
	}
	return out
}

// yamlProblem is a problem at a 1-based line of one YAML document (0 when
// the parser gave none).
type yamlProblem struct {
	line int
	msg  string
}

// checkCloudConfig checks a cloud-config document as util.load_yaml reads
// it: one YAML 1.1 document, a mapping or empty, no key repeated.
func checkCloudConfig(doc []byte) []yamlProblem {
	root, probs := parseYAML11(doc)
	if root == nil || isYAMLNull(root) {
		return probs
	}
	if root.Kind != yaml.MappingNode {
		probs = append(probs, yamlProblem{line: root.Line, msg: fmt.Sprintf("#cloud-config is %s, not a mapping: cloud-init ignores it", yamlKind(root))})
	}
	return probs
}

// parseYAML11 parses doc as PyYAML's safe_load would: exactly one document.
// It returns the root node (nil when doc holds none or fails to parse) and
// the problems: a syntax error, a second document, repeated keys.
//
// The syntax is parsed by go.yaml.in/yaml/v3, a port of libyaml as PyYAML
// is; keys are compared after PyYAML's own YAML 1.1 resolution, as PyYAML
// builds its dict: "yes" and "true" are one key, so are 1, 0x1 and 1.0.
func parseYAML11(doc []byte) (*yaml.Node, []yamlProblem) {
	dec := yaml.NewDecoder(bytes.NewReader(doc))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, []yamlProblem{yamlError(doc, err)}
	}
	var probs []yamlProblem
	var next yaml.Node
	if err := dec.Decode(&next); err == nil {
		probs = append(probs, yamlProblem{line: next.Line, msg: "a second YAML document (---) starts here: cloud-init's loader reads exactly one and ignores this cloud-config"})
	} else if !errors.Is(err, io.EOF) {
		probs = append(probs, yamlError(doc, err))
	}
	n := &root
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	probs = append(probs, repeatedKeys(n)...)
	probs = append(probs, pyyamlLimits(n)...)
	sort.SliceStable(probs, func(i, j int) bool { return probs[i].line < probs[j].line })
	return n, probs
}

func yamlError(doc []byte, err error) yamlProblem {
	line, problem := yamlErrorAt(doc, err.Error())
	if line > 0 {
		return yamlProblem{line: line, msg: "YAML: " + problem + ": cloud-init cannot load this and ignores it"}
	}
	return yamlProblem{msg: problem + ": cloud-init cannot load this and ignores it"}
}

// repeatedKeys finds every mapping key under n that repeats an earlier key
// of its mapping once resolved as YAML 1.1.
func repeatedKeys(n *yaml.Node) []yamlProblem {
	var out []yamlProblem
	var walk func(*yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			first := map[string]*yaml.Node{}
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				id, ok, hashable := yaml11Key(k)
				if !hashable {
					out = append(out, yamlProblem{line: k.Line, msg: fmt.Sprintf("a key here is %s: PyYAML cannot use it as a key, so cloud-init cannot load this and ignores it", yamlKind(k))})
					continue
				}
				if !ok {
					continue
				}
				if f, dup := first[id]; dup && len(out) <= maxUserDataProblems {
					out = append(out, yamlProblem{line: k.Line, msg: fmt.Sprintf("key %q is written again here (first %s above, in the same mapping): cloud-init keeps this last value and silently drops the earlier one; write the key once", k.Value, linesAbove(k.Line-f.Line))})
				}
				first[id] = k
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(n)
	return out
}

// pyyamlTag is the tag PyYAML gives a scalar node: its explicit tag, !!str
// when quoted or a block scalar, else what PyYAML's resolvers make of it.
func pyyamlTag(n *yaml.Node) string {
	switch {
	case n.Style&yaml.TaggedStyle != 0:
		return n.ShortTag()
	case n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0:
		return "!!str"
	}
	return pyyamlResolve(n.Value)
}

// yaml11False reports whether a !!bool scalar is false in PyYAML.
func yaml11False(v string) bool {
	return strings.EqualFold(v, "no") || strings.EqualFold(v, "false") || strings.EqualFold(v, "off")
}

// isZero reports whether an !!int scalar is 0 in PyYAML.
func isZero(v string) bool {
	n, ok := pyyamlInt(v)
	return ok && n == "0"
}

// yaml11Key is the identity PyYAML's SafeLoader gives a key in the dict it
// builds: the key's tag as PyYAML resolves it (an explicit tag, !!str when
// quoted or a block scalar, else PyYAML's implicit resolvers for YAML 1.1),
// then its value compared as Python compares dict keys: True is 1, 3.0 is
// 3, integers have no bound. ok is false for merge keys (plain <<), which
// PyYAML merges rather than stores. hashable is false for a list or a
// mapping used as a key, which PyYAML refuses to load.
func yaml11Key(k *yaml.Node) (id string, ok, hashable bool) {
	for k.Kind == yaml.AliasNode && k.Alias != nil {
		k = k.Alias
	}
	if k.Kind != yaml.ScalarNode {
		return "", true, false
	}
	switch pyyamlTag(k) {
	case "!!merge":
		return "", false, true
	case "!!null":
		return "null", true, true
	case "!!bool":
		if strings.EqualFold(k.Value, "yes") || strings.EqualFold(k.Value, "true") || strings.EqualFold(k.Value, "on") {
			return "n:1", true, true
		}
		return "n:0", true, true
	case "!!int":
		if n, ok := pyyamlInt(k.Value); ok {
			return "n:" + n, true, true
		}
	case "!!float":
		if f, ok := pyyamlFloat(k.Value); ok {
			return pyNumberKey(f), true, true
		}
	case "!!timestamp":
		return "t:" + k.Value, true, true
	}
	return "s:" + k.Value, true, true
}

func linesAbove(n int) string {
	if n == 1 {
		return "1 line"
	}
	return strconv.Itoa(n) + " lines"
}

func isYAMLNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

func yamlKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.ScalarNode:
		return "a scalar (" + strings.TrimPrefix(n.ShortTag(), "!!") + ")"
	}
	return "an alias"
}
