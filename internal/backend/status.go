package backend

import "time"

// SourceStatus is a source's health and counters, for `muxfs status`.
type SourceStatus struct {
	Source   string         `json:"source"`
	State    string         `json:"state"` // up, degraded (a replica member is out), connecting, down, offline (served from the cache), local
	Errors   int64          `json:"errors"`
	Retries  int64          `json:"retries"`  // requests sent again after a lost connection
	Reopened int64          `json:"reopened"` // open files moved to a new session
	Striped  int64          `json:"striped"`  // extra sessions a big read or write went through (stripe.go)
	Members  []MemberStatus `json:"members,omitempty"`

	// Filled in above the backend: where the source is mounted and its memory cache.
	At          string `json:"at,omitempty"`
	CacheHits   int64  `json:"cache_hits"`
	CacheMisses int64  `json:"cache_misses"`
	// The persistent cache: bytes held, bytes read from it, bytes fetched through it.
	DiskBytes        int64 `json:"disk_cache_bytes"`
	DiskHitBytes     int64 `json:"disk_cache_hit_bytes"`
	DiskFetchedBytes int64 `json:"disk_cache_fetched_bytes"`
}

// MemberStatus is one server of a source (one, or each member of a replica set).
type MemberStatus struct {
	Server       string  `json:"server"`
	State        string  `json:"state"`
	Sessions     int     `json:"sessions"`
	Transport    string  `json:"transport,omitempty"` // the live sessions': native (in-process SSH) or ssh (the program)
	RTTMillis    float64 `json:"rtt_ms"`
	InFlight     int64   `json:"in_flight"`
	BytesRead    int64   `json:"bytes_read"`
	BytesWritten int64   `json:"bytes_written"`
	Requests     int64   `json:"requests"` // SFTP requests sent, of every kind
	Reconnects   int64   `json:"reconnects"`
	LastError    string  `json:"last_error,omitempty"`
	Writer       bool    `json:"writer,omitempty"` // takes the changes of a replica set
}

// Reporter is a backend that can report its status.
type Reporter interface {
	Status() SourceStatus
}

// State is the source's health: up while any member is; with several members, the
// caller tells "some out" from the status.
func (s *SFTP) State() State {
	best := StateDown
	for _, m := range s.members {
		best = min(best, m.pool.State())
	}
	return best
}

func (s *SFTP) Status() SourceStatus {
	st := SourceStatus{Source: s.name, Errors: s.errs.Load(), Retries: s.retries.Load(), Reopened: s.reopened.Load(), Striped: s.striped.Load()}
	up := 0
	w := int(s.writer.Load())
	for i, m := range s.members {
		ps := m.pool.Stats()
		if ps.State == StateUp {
			up++
		}
		st.Members = append(st.Members, MemberStatus{
			Server: m.name, State: ps.State.String(), Sessions: ps.Sessions, Transport: ps.Transport,
			RTTMillis: float64(ps.RTT) / float64(time.Millisecond), InFlight: ps.InFlight,
			BytesRead: ps.BytesIn, BytesWritten: ps.BytesOut, Requests: ps.Requests, Reconnects: ps.Reconnects,
			LastError: ps.LastError, Writer: len(s.members) > 1 && i == w,
		})
	}
	switch {
	case up == len(s.members):
		st.State = "up"
	case up > 0:
		st.State = "degraded"
	default:
		st.State = s.State().String()
	}
	return st
}

func (l *Local) Status() SourceStatus {
	return SourceStatus{Source: l.String(), State: "local"}
}
