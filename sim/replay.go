package sim

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// ReplayResult is the shadow report of an access log replayed through rules.
type ReplayResult struct {
	Lines     int          `json:"lines"`
	Requests  int          `json:"requests"`
	Malformed int          `json:"malformed"`
	FirstBad  []int        `json:"firstMalformedLines,omitempty"` // line numbers, at most 10
	From      time.Time    `json:"from"`
	To        time.Time    `json:"to"`
	Rules     []RuleReplay `json:"rules"`
	// PerMinute counts the requests an enforced rule would have rejected in
	// each minute from From; ShadowPerMinute those that only a shadow rule
	// would have (its would-block, which rejected nothing).
	PerMinute       []int `json:"rejectionsPerMinute"`
	ShadowPerMinute []int `json:"shadowWouldBlockPerMinute"`
}

// RuleReplay is one rule's part of a replay.
type RuleReplay struct {
	Rule     string     `json:"rule"`
	Shadow   bool       `json:"shadow"`
	Seen     int        `json:"seen"`
	Rejected int        `json:"rejected"`
	TopKeys  []KeyCount `json:"topKeys"`
}

// KeyCount is a key and how many of its requests would have been rejected.
type KeyCount struct {
	Key      string `json:"key"`
	Rejected int    `json:"rejected"`
}

// ReplayOptions tune a replay.
type ReplayOptions struct {
	// Progress, if set, is told how many bytes have been read so far.
	Progress func(bytes int64)
	// TopKeys is how many keys to list per rule (default 5).
	TopKeys int
}

// maxLineBytes bounds one log line; longer lines count as malformed.
const maxLineBytes = 1 << 20

// Replay reads an access log (combined format or JSON lines, mixed freely),
// puts its requests in timestamp order, and runs them through the rules on
// the embedded store under a simulated clock, as fast as it can. Every rule
// is evaluated as it would be in production (all or nothing, countOn rules
// charged by the logged status); the report says, per rule, how many requests
// it saw and how many it would have rejected, and for whom. Malformed lines
// are counted, never fatal.
func Replay(r io.Reader, cfg *rules.Config, o ReplayOptions) (*ReplayResult, error) {
	if o.TopKeys <= 0 {
		o.TopKeys = 5
	}
	res := &ReplayResult{}
	recs, err := readLog(r, res, o.Progress)
	if err != nil {
		return nil, err
	}
	byTime := func(a, b LogRecord) int { return a.Time.Compare(b.Time) }
	if !slices.IsSortedFunc(recs, byTime) { // most logs are in order already
		slices.SortStableFunc(recs, byTime)
	}
	res.Requests = len(recs)
	if len(recs) > 0 {
		res.From, res.To = recs[0].Time, recs[len(recs)-1].Time
	}

	clock := sluice.NewManualClock(res.From)
	// The replay's memory is bounded like production's: past the default
	// key bound, the keys closest to idle are evicted.
	eng, err := engine.New(cfg, engine.Options{Store: memory.New(memory.WithClock(clock))})
	if err != nil {
		return nil, err
	}
	byRule := map[string]*RuleReplay{}
	keys := map[string]map[string]int{}
	res.Rules = make([]RuleReplay, len(cfg.Rules))
	for i, rule := range cfg.Rules {
		res.Rules[i] = RuleReplay{Rule: rule.ID, Shadow: rule.Shadow}
		byRule[rule.ID] = &res.Rules[i]
		keys[rule.ID] = map[string]int{}
	}
	var result engine.Result
	ctx := context.Background()
	req := &rules.Request{}
	for i := range recs {
		rec := &recs[i]
		clock.Set(rec.Time)
		rec.request(req)
		eng.Check(ctx, req, engine.CheckOptions{}, &result)
		rejected, shadowOnly := false, false
		for j := range result.Statuses {
			st := &result.Statuses[j]
			rr := byRule[st.Rule]
			if rr == nil {
				continue
			}
			rr.Seen++
			if !st.Allowed {
				rr.Rejected++
				keys[st.Rule][st.Key()]++
				if st.Shadow {
					shadowOnly = true
				} else {
					rejected = true
				}
			}
		}
		if result.Allowed {
			eng.Charge(ctx, &result, rec.Status)
		}
		m := int(rec.Time.Sub(res.From) / time.Minute)
		for len(res.PerMinute) <= m {
			res.PerMinute = append(res.PerMinute, 0)
			res.ShadowPerMinute = append(res.ShadowPerMinute, 0)
		}
		switch {
		case rejected:
			res.PerMinute[m]++
		case shadowOnly:
			res.ShadowPerMinute[m]++
		}
	}
	if res.PerMinute == nil { // JSON lists, never null
		res.PerMinute, res.ShadowPerMinute = []int{}, []int{}
	}
	for i := range res.Rules {
		res.Rules[i].TopKeys = topKeys(keys[res.Rules[i].Rule], o.TopKeys)
	}
	return res, nil
}

// request sets req to the logged request; the log's user, if any, is the
// "user" attribute unless the record names one.
func (rec *LogRecord) request(req *rules.Request) {
	*req = rules.Request{Method: rec.Method, Host: rec.Host, Path: rec.Path, RawQuery: rec.RawQuery,
		ClientIP: rec.IP, Header: rec.Header, Attributes: rec.Attrs}
	if rec.User != "" {
		if req.Attributes == nil {
			req.Attributes = map[string]string{}
		}
		if _, ok := req.Attributes["user"]; !ok {
			req.Attributes["user"] = rec.User
		}
	}
}

// topKeys are the n keys most rejected, the most first (ties by key), of
// rejections counted by key; never nil.
func topKeys(rejections map[string]int, n int) []KeyCount {
	top := []KeyCount{}
	for k, r := range rejections {
		top = append(top, KeyCount{k, r})
	}
	slices.SortFunc(top, func(a, b KeyCount) int {
		return cmp.Or(cmp.Compare(b.Rejected, a.Rejected), strings.Compare(a.Key, b.Key))
	})
	return top[:min(len(top), n)]
}

func readLog(r io.Reader, res *ReplayResult, progress func(int64)) ([]LogRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	var recs []LogRecord
	if s, ok := r.(interface{ Size() int64 }); ok { // *bytes.Reader, *strings.Reader
		recs = make([]LogRecord, 0, s.Size()/100)
	} else if f, ok := r.(interface{ Stat() (os.FileInfo, error) }); ok {
		if info, err := f.Stat(); err == nil && info.Mode().IsRegular() {
			recs = make([]LogRecord, 0, info.Size()/100)
		}
	}
	var read int64
	for sc.Scan() {
		res.Lines++
		line := sc.Bytes()
		read += int64(len(line)) + 1
		if progress != nil && res.Lines%65536 == 0 {
			progress(read)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			res.Lines--
			continue
		}
		rec, err := ParseLogLine(line)
		if err != nil {
			res.Malformed++
			if len(res.FirstBad) < 10 {
				res.FirstBad = append(res.FirstBad, res.Lines)
			}
			continue
		}
		recs = append(recs, rec)
	}
	if progress != nil {
		progress(read)
	}
	if err := sc.Err(); err != nil {
		if err == bufio.ErrTooLong {
			return nil, fmt.Errorf("sim: line %d is longer than %d bytes", res.Lines+1, maxLineBytes)
		}
		return nil, err
	}
	return recs, nil
}

// Report formats the replay as a report: a table of rules, the top keys, and
// a per-minute text chart of would-be rejections.
func (res *ReplayResult) Report() *Report {
	rep := &Report{
		Title: fmt.Sprintf("replay: %s from %s to %s; %s skipped",
			count(res.Requests, "request"), res.From.Format(time.RFC3339), res.To.Format(time.RFC3339), count(res.Malformed, "malformed line")),
		Columns: []string{"rule", "mode", "seen", "would reject", "share", "top key", "its rejections"},
		JSON:    res,
	}
	var topNotes []string
	for _, rr := range res.Rules {
		mode := "enforce"
		if rr.Shadow {
			mode = "shadow"
		}
		share := "-"
		if rr.Seen > 0 {
			share = strconv.FormatFloat(100*float64(rr.Rejected)/float64(rr.Seen), 'f', 1, 64) + "%"
		}
		// One value per cell: the top key here, every top key in a note.
		topKey, topN := "", ""
		if len(rr.TopKeys) > 0 {
			topKey, topN = rr.TopKeys[0].Key, strconv.Itoa(rr.TopKeys[0].Rejected)
		}
		rep.Rows = append(rep.Rows, []string{rr.Rule, mode, strconv.Itoa(rr.Seen), strconv.Itoa(rr.Rejected), share, topKey, topN})
		if len(rr.TopKeys) > 1 {
			var top []string
			for _, k := range rr.TopKeys {
				top = append(top, fmt.Sprintf("%s (%d)", k.Key, k.Rejected))
			}
			topNotes = append(topNotes, fmt.Sprintf("  %s: %s", rr.Rule, strings.Join(top, ", ")))
		}
	}
	if len(topNotes) > 0 {
		rep.Notes = append(rep.Notes, "Top keys by rejections:\n"+strings.Join(topNotes, "\n"))
	}
	if len(res.PerMinute) > 0 {
		// One bar per minute: # for the requests an enforced rule would
		// reject, + for those only a shadow rule would (it rejects nothing).
		peak := 0
		for m := range res.PerMinute {
			peak = max(peak, res.PerMinute[m]+res.ShadowPerMinute[m])
		}
		var chart strings.Builder
		chart.WriteString("Would-be rejections per minute (# enforced, + shadow only):\n")
		for m, n := range res.PerMinute {
			sh := res.ShadowPerMinute[m]
			bar := func(k int, mark string) string {
				if peak == 0 {
					return ""
				}
				return strings.Repeat(mark, (k*50+peak-1)/peak)
			}
			fmt.Fprintf(&chart, "  %s %s%s %d enforced, %d shadow\n", res.From.Add(time.Duration(m)*time.Minute).Format("15:04"),
				bar(n, "#"), bar(sh, "+"), n, sh)
		}
		rep.Notes = append(rep.Notes, strings.TrimRight(chart.String(), "\n"))
	}
	if len(res.FirstBad) > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("Malformed lines (first %d): %v", len(res.FirstBad), res.FirstBad))
	}
	return rep
}

// count writes n and a noun that takes an s: "1 request", "9 requests".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
