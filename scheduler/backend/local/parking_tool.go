//go:build !failpoints

package local

// checkpointToolFor is how replicas' CUDA processes are checkpointed: by
// the inferd cuda-checkpoint helper (parking.go). Test builds may fake it
// (parking_failpoint.go).
func checkpointToolFor(cfg Config) checkpointTool { return newHelperTool(cfg.GPUs) }
