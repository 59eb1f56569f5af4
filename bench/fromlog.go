package main

import (
	"bufio"
	"errors"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// A measurement line of the run's log: "15:04:05 2ms tree muxfs rep 1: find cold=1.2s ...",
// and a failure: "15:04:05 0s tree rclone: <error>".
var (
	repLine  = regexp.MustCompile(`^\S+ (\S+) (\S+) (\S+) rep \d+: (.*)$`)
	failLine = regexp.MustCompile(`^\S+ (\S+) (\S+) (\S+): (.*)$`)
	// A rep line is summary's output: "name=value+unit" pairs joined by spaces, the
	// names free text without "=" (spaces, apostrophes, commas).
	valueRe = regexp.MustCompile(`\s*([^=]+?)=([0-9.e+]+)(` + unitsRe() + `)(?:\s|$)`)
	// The host's steal during a measurement kept ("... (steal 0.4%)" at the end of a
	// rep line), a measurement taken again ("... rep 1 retaken, steal 12.3%: ..."),
	// and the run's limit ("max steal: 5%, 2 retakes").
	stealRe    = regexp.MustCompile(` \(steal ([0-9.]+)%\)$`)
	retakenRe  = regexp.MustCompile(`^\S+ \S+ \S+ \S+ rep \d+ retaken, steal `)
	maxStealRe = regexp.MustCompile(` max steal: ([0-9.]+)%`)
)

// unitsRe matches every unit of units: a unit missing here would make the value
// before it part of the next reading's name.
func unitsRe() string {
	var us []string
	for u := range units {
		us = append(us, regexp.QuoteMeta(u))
	}
	sort.Strings(us)
	return strings.Join(us, "|")
}

// loadLog rebuilds the results of a run from its log, so that a report can be written
// for a run that was stopped before it ended. Values carry the log's 3 significant
// digits.
func loadLog(file string) (*store, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := newStore()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if _, fs, ok := strings.Cut(line, " filesystem: "); ok {
			s.fs = fs
			continue
		}
		if _, m, ok := strings.Cut(line, " machine: "); ok {
			s.machine = m
			continue
		}
		if m := maxStealRe.FindStringSubmatch(line); m != nil {
			s.maxSteal, _ = strconv.ParseFloat(m[1], 64)
			continue
		}
		if strings.HasSuffix(line, gaveUpText) {
			s.stealGaveUp = true
			continue
		}
		if retakenRe.MatchString(line) {
			s.retaken++
			continue
		}
		if m := repLine.FindStringSubmatch(line); m != nil {
			if st := stealRe.FindStringSubmatch(m[4]); st != nil {
				if v, err := strconv.ParseFloat(st[1], 64); err == nil {
					s.kept(v)
				}
			}
			rtt, err := time.ParseDuration(m[1])
			if err != nil {
				continue
			}
			for _, v := range valueRe.FindAllStringSubmatch(m[4], -1) {
				x, err := strconv.ParseFloat(v[2], 64)
				if err != nil {
					continue
				}
				s.add(rtt, m[2], m[3], result{metric: strings.TrimSpace(v[1]), unit: v[3], value: x, higher: !lowerIsBetter(v[3])})
			}
			continue
		}
		if m := failLine.FindStringSubmatch(line); m != nil && isWorkload(m[2]) {
			if rtt, err := time.ParseDuration(m[1]); err == nil {
				s.fail(rtt, m[2], m[3], errors.New(m[4]))
			}
		}
	}
	return s, sc.Err()
}

func isWorkload(name string) bool {
	for _, w := range workloads {
		if w.name == name {
			return true
		}
	}
	return false
}
