package gittest

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Request is one request git http-backend answered, with what it cost:
// the CPU time (user and system) of the http-backend process and every git
// process it waited for (receive-pack, upload-pack, index-pack,
// rev-list, gc --auto when it does not detach), as wait4 reports it.
type Request struct {
	// Method is GET or POST; Path the URL path (the repository's, then
	// /info/refs or /git-receive-pack …); Service the git service asked
	// for: "receive-pack" or "upload-pack" ("" for a dumb request).
	Method, Path, Service string
	// Advertisement is set for a GET of info/refs (the ref advertisement
	// that starts every push and fetch), unset for the POST that carries
	// the pack.
	Advertisement bool
	CPU           time.Duration
	// Status is the HTTP status the backend answered with.
	Status int
	// Header is the request's header (a test's Wrap may tag its
	// clients there).
	Header http.Header
}

// accountingBackend runs git http-backend as a CGI program, as
// net/http/cgi does, and hands each request's CPU time to account. It
// exists because net/http/cgi does not expose the child's rusage; the
// environment it gives git is the CGI one (RFC 3875) that http-backend
// reads: REQUEST_METHOD, PATH_INFO, QUERY_STRING, CONTENT_TYPE,
// CONTENT_LENGTH, REMOTE_USER, REMOTE_ADDR and every request header as
// HTTP_*.
type accountingBackend struct {
	gitBin  string
	env     []string
	stderr  io.Writer
	account func(Request)
}

func (a *accountingBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cmd := exec.Command(a.gitBin, "http-backend")
	cmd.Env = append(baseEnv(), a.env...)
	cmd.Env = append(cmd.Env, cgiEnv(r)...)
	cmd.Stdin = r.Body
	cmd.Stderr = a.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if err := cmd.Start(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	code := copyCGIResponse(w, bufio.NewReader(out))
	_ = cmd.Wait()
	if ps := cmd.ProcessState; ps != nil && a.account != nil {
		req := Request{Method: r.Method, Path: r.URL.Path, Status: code, Header: r.Header, CPU: ps.UserTime() + ps.SystemTime()}
		svc := r.URL.Query().Get("service")
		req.Advertisement = strings.HasSuffix(r.URL.Path, "/info/refs")
		if !req.Advertisement {
			svc = r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		}
		req.Service = strings.TrimPrefix(svc, "git-")
		a.account(req)
	}
}

// cgiEnv is the CGI environment of r.
func cgiEnv(r *http.Request) []string {
	env := []string{
		"GATEWAY_INTERFACE=CGI/1.1", "SERVER_PROTOCOL=HTTP/1.1", "SERVER_SOFTWARE=gittest",
		"REQUEST_METHOD=" + r.Method, "PATH_INFO=" + r.URL.Path, "QUERY_STRING=" + r.URL.RawQuery,
		"REMOTE_ADDR=" + r.RemoteAddr, "SCRIPT_NAME=",
	}
	if u, _, ok := r.BasicAuth(); ok {
		env = append(env, "REMOTE_USER="+u)
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		env = append(env, "CONTENT_TYPE="+ct)
	}
	if r.ContentLength >= 0 {
		env = append(env, "CONTENT_LENGTH="+strconv.FormatInt(r.ContentLength, 10))
	}
	for k, v := range r.Header {
		if k == "Authorization" || k == "Content-Type" || k == "Content-Length" {
			continue
		}
		env = append(env, "HTTP_"+strings.ReplaceAll(strings.ToUpper(k), "-", "_")+"="+strings.Join(v, ", "))
	}
	return env
}

// copyCGIResponse writes a CGI program's output (header lines, a blank
// line, the body) as the HTTP answer and returns its status.
func copyCGIResponse(w http.ResponseWriter, out *bufio.Reader) int {
	hdr, err := textproto.NewReader(out).ReadMIMEHeader()
	if err != nil && len(hdr) == 0 {
		http.Error(w, fmt.Sprintf("git http-backend: bad CGI header: %v", err), http.StatusBadGateway)
		_, _ = io.Copy(io.Discard, out)
		return http.StatusBadGateway
	}
	code := http.StatusOK
	if s := hdr.Get("Status"); s != "" {
		if n, err := strconv.Atoi(strings.Fields(s)[0]); err == nil {
			code = n
		}
		hdr.Del("Status")
	}
	for k, v := range hdr {
		w.Header()[k] = v
	}
	w.WriteHeader(code)
	buf := make([]byte, 32<<10)
	for {
		n, err := out.Read(buf)
		if n > 0 {
			_, _ = w.Write(buf[:n])
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
		}
		if err != nil {
			return code
		}
	}
}
