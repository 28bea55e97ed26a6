package agentapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Client is the one client of the agent's API on its unix socket (ENI
// IPAM, policy devices, verdicts and events, config, health, statedb):
// what enimasq-cni, enimasq-dbg and the tests send and how they read the
// answers.
type Client struct {
	socket string
	http   *http.Client
}

// NewClient talks to the agent on socket; a call gives up after timeout
// (0: never, for a stream that follows).
func NewClient(socket string, timeout time.Duration) *Client {
	return &Client{
		socket: socket,
		http: &http.Client{
			Timeout: timeout,
			Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", socket)
			}},
		},
	}
}

// maxAnswer bounds what is read of an answer; maxLine a line of a stream.
const (
	maxAnswer = 64 << 20
	maxLine   = 1 << 20
)

// NotRunningError says that nothing answers on the socket.
type NotRunningError struct {
	Socket string
	Err    error
}

func (e *NotRunningError) Error() string {
	return fmt.Sprintf("enimasq-agent is not running (cannot connect to %s: %v)", e.Socket, e.Err)
}

func (e *NotRunningError) Unwrap() error { return e.Err }

// NotRunning is the error of an agent that cannot be reached on socket.
func NotRunning(socket string, err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	return &NotRunningError{Socket: socket, Err: err}
}

// APIError is an error answer of the agent: its status and body. Answer
// is the body as it came, for what an endpoint adds to Error (IPAM's
// result).
type APIError struct {
	Code   int
	Body   Error
	Answer []byte
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s (%s, %d)", e.Body.Message, e.Body.Reason, e.Code)
}

// Get fetches path and returns the status and body as they are: the caller
// reads the status (/healthz answers 503 with a body).
func (c *Client) Get(path string) (int, []byte, error) {
	return c.Send(http.MethodGet, path, nil)
}

// Send sends body (as JSON, unless nil) and returns the status and the
// answer as they are, whatever the status: for a caller that reads an
// error answer itself. The error is of the call (a *NotRunningError when
// nothing answers on the socket), never of the status.
func (c *Client) Send(method, path string, body any) (int, []byte, error) {
	var data []byte
	if body != nil {
		var err error
		if data, err = json.Marshal(body); err != nil {
			return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return c.send(method, path, data)
}

// Do sends body as JSON and decodes a JSON answer into out. An answer of
// 300 or more is an error: an *APIError when it has the agent's error body,
// else one that quotes the answer.
func (c *Client) Do(method, path string, body, out any) (int, error) {
	code, answer, err := c.Send(method, path, body)
	if err != nil {
		return code, err
	}
	if code >= 300 {
		return code, answerError(method, path, code, answer)
	}
	if out != nil {
		if err := json.Unmarshal(answer, out); err != nil {
			return code, fmt.Errorf("agent answer to %s %s: %w", method, path, err)
		}
	}
	return code, nil
}

// answerError is the error of an answer of code: an *APIError when it has
// the agent's error body, else one that quotes it.
func answerError(method, path string, code int, answer []byte) error {
	e := &APIError{Code: code, Answer: answer}
	if json.Unmarshal(answer, &e.Body) == nil && e.Body.Message != "" {
		return e
	}
	return fmt.Errorf("agent answered %d to %s %s: %s", code, method, path, strings.TrimSpace(string(answer)))
}

func (c *Client) send(method, path string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://agent"+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.do(req, path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return resp.StatusCode, answer, nil
}

// do sends req for path: an agent that cannot be reached is a
// *NotRunningError.
func (c *Client) do(req *http.Request, path string) (*http.Response, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, NotRunning(c.socket, err)
		}
		return nil, fmt.Errorf("%s %s: %w", req.Method, path, err)
	}
	return resp, nil
}

// Stream gets path, a stream of JSON lines (Stream on the server), and
// calls each with every line as it comes, until the agent ends the stream
// (nil), each fails (its error), or ctx ends (ctx's error). An answer other
// than 200 is an error as Do's, with its status.
func (c *Client) Stream(ctx context.Context, path string, each func(line []byte) error) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+path, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.do(req, path)
	if err != nil {
		if ctx.Err() != nil && !errors.As(err, new(*NotRunningError)) {
			return 0, ctx.Err()
		}
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		answer, _ := io.ReadAll(io.LimitReader(resp.Body, maxLine))
		return resp.StatusCode, answerError(http.MethodGet, path, resp.StatusCode, answer)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		if err := each(sc.Bytes()); err != nil {
			return resp.StatusCode, err
		}
	}
	switch {
	case ctx.Err() != nil:
		return resp.StatusCode, ctx.Err()
	case sc.Err() != nil:
		return resp.StatusCode, fmt.Errorf("GET %s: %w", path, sc.Err())
	}
	return resp.StatusCode, nil
}
