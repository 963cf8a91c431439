package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/display"
	"github.com/rte-project/rte/internal/refapp/sse"
	"github.com/rte-project/rte/protocol"
)

// Client talks to a running reference app over its admin API.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
}

// apiError is an answer other than 2xx, with the app's own words.
type apiError struct {
	Status  int
	Message string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("the app answered %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
}

func NewClient(appURL, token string) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(appURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--app %s is not an http:// or https:// URL of the app, such as http://127.0.0.1:8080", config.Quote(appURL))
	}
	if token == "" {
		return nil, errors.New("APP_ADMIN_TOKEN is not set: export the admin token the app was started with")
	}
	// No overall timeout: a stream lasts as long as its job. Each call passes a context.
	return &Client{base: u, token: token, http: &http.Client{}}, nil
}

func (c *Client) url(path string, q url.Values) string {
	u := *c.base
	u.Path += path
	u.RawQuery = q.Encode()
	return u.String()
}

// do sends one request and decodes a 2xx JSON answer into out (when not nil).
func (c *Client) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	return c.doWithin(ctx, 30*time.Second, method, path, q, in, out)
}

// doWithin is do with its own time limit, for a call the app answers slowly on purpose (a
// connection check waits for the runner).
func (c *Client) doWithin(ctx context.Context, limit time.Duration, method, path string, q url.Values, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url(path, q), body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w (is the app running at %s?)", method, path, unwrapURLError(err), c.base)
	}
	defer resp.Body.Close()
	if err := answerError(resp); err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, sse.MaxEventBytes)).Decode(out); err != nil {
		return fmt.Errorf("%s %s: the answer is not the JSON expected: %w", method, path, err)
	}
	return nil
}

// answerError turns a non-2xx answer into an *apiError carrying the app's message.
func answerError(resp *http.Response) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e api.ErrorResponse
	msg := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		msg = e.Error
	}
	return &apiError{Status: resp.StatusCode, Message: display.OneLine(msg, 500)}
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func (c *Client) Runners(ctx context.Context) ([]api.RunnerView, error) {
	var out api.RunnersResponse
	err := c.do(ctx, http.MethodGet, "/api/v2/runners", nil, nil, &out)
	return out.Runners, err
}

func (c *Client) Approve(ctx context.Context, name, fingerprint, sha256 string) (api.RunnerView, error) {
	var out api.RunnerView
	var in any
	if fingerprint != "" || sha256 != "" {
		in = api.ApproveRequest{CertificateFingerprint: fingerprint, CertificateSHA256: sha256}
	}
	err := c.do(ctx, http.MethodPost, "/api/v2/runners/"+url.PathEscape(name)+"/approve", nil, in, &out)
	return out, err
}

func (c *Client) clearWaiting(ctx context.Context, reason string) ([]string, error) {
	var out api.ClearWaitingResponse
	var in any
	if reason != "" {
		in = api.ClearWaitingRequest{Reason: reason}
	}
	err := c.do(ctx, http.MethodPost, "/api/v2/runners/clear-waiting", nil, in, &out)
	return out.Cleared, err
}

func (c *Client) reject(ctx context.Context, name, reason string) error {
	var in any
	if reason != "" {
		in = api.RejectRequest{Reason: reason}
	}
	return c.do(ctx, http.MethodPost, "/api/v2/runners/"+url.PathEscape(name)+"/reject", nil, in, nil)
}

func (c *Client) Submit(ctx context.Context, req api.JobRequest) (api.JobView, error) {
	var out api.JobView
	err := c.do(ctx, http.MethodPost, "/api/v2/jobs", nil, req, &out)
	return out, err
}

// Records is up to limit of the job's stored records after seq after, in order. The answer is
// read up to sse.MaxEventBytes, as every answer is: ask for as many records as fit in it.
func (c *Client) Records(ctx context.Context, id string, after int64, limit int) ([]protocol.Record, error) {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}, "limit": {strconv.Itoa(limit)}}
	var out api.RecordsResponse
	err := c.do(ctx, http.MethodGet, "/api/v2/jobs/"+url.PathEscape(id)+"/records", q, nil, &out)
	return out.Records, err
}

// Jobs lists jobs, newest first: of runner ("" for every runner), in the comma-separated
// states ("" for all), at most limit (0 for the app's default).
func (c *Client) Jobs(ctx context.Context, runner, states string, limit int) ([]api.JobView, error) {
	q := url.Values{}
	if runner != "" {
		q.Set("runner", runner)
	}
	if states != "" {
		q.Set("state", states)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out api.JobsResponse
	err := c.do(ctx, http.MethodGet, "/api/v2/jobs", q, nil, &out)
	return out.Jobs, err
}

// Job is one job as the app stores it now.
func (c *Client) Job(ctx context.Context, id string) (api.JobView, error) {
	var out api.JobView
	err := c.do(ctx, http.MethodGet, "/api/v2/jobs/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

func (c *Client) cancel(ctx context.Context, id string) (api.JobView, error) {
	var out api.JobView
	err := c.do(ctx, http.MethodPost, "/api/v2/jobs/"+url.PathEscape(id)+"/cancel", nil, nil, &out)
	return out, err
}

// OpenStream opens the job's event stream after seq after. The caller closes the body.
func (c *Client) OpenStream(ctx context.Context, id string, after int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url("/api/v2/jobs/"+url.PathEscape(id)+"/stream", nil), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "text/event-stream")
	if after > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(after, 10))
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("stream of job %s: %w (is the app running at %s?)", id, unwrapURLError(err), c.base)
	}
	if err := answerError(resp); err != nil {
		resp.Body.Close()
		return nil, err
	}
	if !sse.IsStream(resp) {
		resp.Body.Close()
		return nil, fmt.Errorf("stream of job %s: the app answered %s, not an event stream", id, config.Quote(resp.Header.Get("Content-Type")))
	}
	return resp, nil
}
