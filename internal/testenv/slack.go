package testenv

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SlackVar is the environment variable that stretches every deadline of the
// tests by a factor (a number ≥ 1), for a machine the suite knows is slow or
// busy: make test-busy sets it beside its CPU hog.
const SlackVar = "INFERD_TEST_SLACK"

// maxLoadSlack caps the factor the load average alone gives: past it a
// deadline no longer ends a hung test in useful time.
const maxLoadSlack = 8

// slack is the factor, decided once per test binary (at its first use: the
// e2e TestMain asks for it before any test runs), so that every deadline
// of a run is stretched alike.
var slack = sync.OnceValue(func() slackFactor {
	load, ok := loadAverage()
	return decideSlack(os.Getenv(SlackVar), load[0], ok, runtime.NumCPU())
})

// decideSlack is the factor for SlackVar's value env, the one-minute load
// average (haveLoad false where the system has none) and the cores.
func decideSlack(env string, load float64, haveLoad bool, cores int) slackFactor {
	s := slackFactor{f: 1, cores: max(cores, 1)}
	if haveLoad {
		s.load = load
		if perCore := load / float64(s.cores); perCore > 1 {
			s.f = math.Min(perCore, maxLoadSlack)
		}
	}
	if env != "" {
		f, err := strconv.ParseFloat(env, 64)
		if err != nil || !(f >= 1) || math.IsInf(f, 0) {
			s.bad = env
		} else {
			s.env = f
			s.f = math.Max(s.f, f)
		}
	}
	return s
}

type slackFactor struct {
	f     float64 // the factor in force: the larger of env and load per core, at least 1
	env   float64 // SlackVar's value, 0 when unset
	bad   string  // SlackVar's value when it is not a number ≥ 1 (ignored)
	load  float64 // the one-minute load average when the factor was decided
	cores int
}

// Slack is the factor every deadline of the tests is stretched by: the
// larger of SlackVar and the one-minute load average per core when the test
// binary first asked (capped at 8), and at least 1. A quiet machine gets 1.
// A test's deadline only ends a test that would otherwise hang, so a
// longer one costs nothing while the test passes.
func Slack() float64 { return slack().f }

// Scale returns d stretched by Slack: the deadline a test waits under.
func Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * Slack())
}

// SlackReport says what the factor is and why, for a test run's log.
func SlackReport() string { return slack().String() }

func (s slackFactor) String() string {
	why := fmt.Sprintf("load average %.2f on %d cores", s.load, s.cores)
	if s.env != 0 {
		why += fmt.Sprintf(", %s=%g", SlackVar, s.env)
	}
	if s.bad != "" {
		why += fmt.Sprintf(", %s=%q ignored (want a number ≥ 1)", SlackVar, s.bad)
	}
	return fmt.Sprintf("deadlines ×%.1f (%s, when the tests began)", s.f, why)
}

// Load says how loaded the machine is now and how the deadlines were
// stretched, for the message of a test that waited in vain: a wait that
// failed on a machine far busier than its cores is most likely load, and
// the test is worth running again alone before chasing it.
func Load() string {
	now := "load average unknown"
	if load, ok := loadAverage(); ok {
		now = fmt.Sprintf("load average %.2f %.2f %.2f", load[0], load[1], load[2])
	}
	return fmt.Sprintf("%s on %d cores now; %s", now, runtime.NumCPU(), SlackReport())
}

// Waited is the failure message of a wait that ran out: what it waited for,
// the deadline it had (d, scaled), and how loaded the machine is.
func Waited(d time.Duration, what string) string {
	return fmt.Sprintf("not within %s (%s ×%.1f): %s [%s]", Scale(d).Round(time.Millisecond), d, Slack(), what, Load())
}

// loadAverage reads the 1, 5 and 15 minute load averages (Linux's
// /proc/loadavg); ok is false where there is none.
func loadAverage() (load [3]float64, ok bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return load, false
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return load, false
	}
	for i := range load {
		if load[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return load, false
		}
	}
	return load, true
}
