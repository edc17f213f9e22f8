package status

import (
	"context"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/gpu"
	"inferd/history"
	"inferd/httpapi/respond"
	"inferd/pipeline"
)

// History is what the status charts read of *history.Recorder.
type History interface {
	Samples(ctx context.Context) ([]history.Sample, error)
	Interval() time.Duration
}

// Charts is GET /v1/status/history: one point per sample, oldest
// first, over the caller's projects (an admin's: all), and each GPU's
// memory at the same points.
type Charts struct {
	IntervalSeconds float64        `json:"intervalSeconds"`
	Points          []historyPoint `json:"points"`
	GPUs            []historyGPU   `json:"gpus"`
}

type historyPoint struct {
	Time            time.Time `json:"time"` // end of the interval
	SucceededPerSec float64   `json:"succeededPerSec"`
	FailedPerSec    float64   `json:"failedPerSec"`
	// Latency (created → finished) of the interval's calls that reached a
	// replica, within about 10 %; null when none finished.
	LatencyP50 *int64 `json:"latencyP50Ms"`
	LatencyP95 *int64 `json:"latencyP95Ms"`
	Queued     int    `json:"queued"` // waiting in the queues at the end
}

// historyGPU is one GPU (of the current inventory) and its memory at each
// point; null where the GPU was not there.
type historyGPU struct {
	Index            int       `json:"index"`
	UUID             string    `json:"uuid"`
	Name             string    `json:"name"`
	MemoryTotalBytes uint64    `json:"memoryTotalBytes"`
	MemoryUsedBytes  []*uint64 `json:"memoryUsedBytes"`
}

// history handles GET /v1/status/history.
func (s *api) history(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	key, err := s.key(r)
	if err != nil {
		respond.Error(w, r, s.log, err)
		return
	}
	samples, err := s.src.History.Samples(r.Context())
	if err != nil {
		respond.Error(w, r, s.log, err)
		return
	}
	out := Charts{
		IntervalSeconds: s.src.History.Interval().Seconds(),
		Points:          make([]historyPoint, 0, len(samples)),
		GPUs:            []historyGPU{},
	}
	for _, smp := range samples {
		pt := historyPoint{Time: smp.At.UTC()}
		lat := history.Latencies{}
		for _, p := range smp.Projects {
			if !pipeline.Reaches(key, p.TeamID, p.ID) {
				continue
			}
			pt.SucceededPerSec += float64(p.Succeeded)
			pt.FailedPerSec += float64(p.Failed)
			pt.Queued += p.Queued
			lat.Merge(p.Latency)
		}
		if secs := smp.Interval.Seconds(); secs > 0 {
			pt.SucceededPerSec /= secs
			pt.FailedPerSec /= secs
		}
		pt.LatencyP50, pt.LatencyP95 = quantileMs(lat, 0.5), quantileMs(lat, 0.95)
		out.Points = append(out.Points, pt)
	}
	// Every key sees every GPU's memory, as on the GPU cards: which
	// replica holds a GPU is what stays private.
	if s.src.GPUs != nil {
		for _, d := range s.src.GPUs() {
			g := historyGPU{Index: d.Index, UUID: d.UUID, Name: d.Name, MemoryTotalBytes: d.MemoryTotalMiB << 20,
				MemoryUsedBytes: make([]*uint64, len(samples))}
			for i, smp := range samples {
				if sd, ok := deviceByUUID(smp.GPUs, d.UUID); ok {
					used := gpu.MemoryOf(sd, smp.Reserved).Used
					g.MemoryUsedBytes[i] = &used
				}
			}
			out.GPUs = append(out.GPUs, g)
		}
	}
	respond.JSON(w, http.StatusOK, out)
}

func quantileMs(l history.Latencies, q float64) *int64 {
	d, ok := l.Quantile(q)
	if !ok {
		return nil
	}
	ms := d.Milliseconds()
	return &ms
}

func deviceByUUID(devs []gpu.Device, uuid string) (gpu.Device, bool) {
	for _, d := range devs {
		if d.UUID == uuid {
			return d, true
		}
	}
	return gpu.Device{}, false
}
