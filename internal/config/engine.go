package config

import (
	"math"
	"strconv"
	"strings"

	units "github.com/docker/go-units"

	"github.com/rte-project/rte/protocol"
)

// Engines of RTE_ENGINE.
const (
	EngineProcess = "process"
	EngineDocker  = "docker"
	EnginePodman  = "podman"
)

// defaultEngineHost is RTE_ENGINE_HOST when it is not set: where each engine's API usually
// answers (Podman's is its Docker-compatible service, `podman system service`).
var defaultEngineHost = map[string]string{
	EngineDocker: "unix:///var/run/docker.sock",
	EnginePodman: "unix:///run/podman/podman.sock",
}

// minJobMemory is the smallest memory limit the Docker engine accepts for a container.
const minJobMemory = 6 << 20

// checkEngine validates RTE_ENGINE and the container settings, which only count with a
// container engine.
func (s *Settings) checkEngine(p *Problems) {
	s.Engine = strings.ToLower(s.Engine)
	s.Pull = strings.ToLower(s.Pull)
	switch s.Engine {
	case EngineProcess:
		return
	case EngineDocker, EnginePodman:
	default:
		p.Add("RTE_ENGINE", "%s is not an engine: use process (the default: each job a process group on this host), docker or podman (each job in its own container)", Quote(s.Engine))
		return
	}
	if s.EngineHost == "" {
		s.EngineHost = defaultEngineHost[s.Engine]
	}
	if s.Image == "" {
		p.Add("RTE_IMAGE", "required with RTE_ENGINE=%s: name the job image (an execution environment with ansible-core, such as rte:dev built by ./scripts/image)", s.Engine)
	} else if strings.ContainsFunc(s.Image, isControl) || strings.ContainsAny(s.Image, " \t") || len(s.Image) > 255 || !protocol.ValidImage(s.Image) {
		// protocol.ValidImage too: hello lists RTE_IMAGE, and the app refuses a hello it
		// cannot validate.
		p.Add("RTE_IMAGE", "%s is not an image reference: use name[:tag] or name@sha256:digest without spaces", Quote(s.Image))
	}
	for _, pat := range s.ImagesAllowList() {
		if !protocol.ValidImagePattern(pat) {
			p.Add("RTE_IMAGES_ALLOW", "%s is not an image reference or pattern: list references such as registry.example/ee-216:1 or patterns such as registry.example/ee-*:*, separated by commas (* stands for any characters but /)", Quote(pat))
		}
	}
	if !strings.HasPrefix(s.EngineHost, "unix://") && !strings.HasPrefix(s.EngineHost, "tcp://") {
		p.Add("RTE_ENGINE_HOST", "%s is not an engine address: use %s (the default with RTE_ENGINE=%s) or tcp://host:2375", Quote(s.EngineHost), defaultEngineHost[s.Engine], s.Engine)
	}
	switch s.Pull {
	case "never", "if-missing", "always":
	default:
		p.Add("RTE_PULL", "%s is not a pull policy: use never (the default), if-missing or always", Quote(s.Pull))
	}
	if s.Files == protocol.FilesLocal {
		p.Add("RTE_ENGINE", "%s runs each job in a container that sees only the job's directory, so RTE_FILES=local (playbooks under ANSIBLE_PATH on this host) cannot work with it: use RTE_FILES=transfer, or RTE_ENGINE=process", s.Engine)
	}
	if s.JobNetwork == "" || strings.ContainsFunc(s.JobNetwork, isControl) {
		p.Add("RTE_JOB_NETWORK", "%s is not a network name: use bridge (the default), none, or a network's name", Quote(s.JobNetwork))
	}
	if s.JobCPUs != "" {
		if n, err := strconv.ParseFloat(s.JobCPUs, 64); err != nil || n <= 0 || math.IsInf(n, 0) || n > 1024 {
			p.Add("RTE_JOB_CPUS", "%s is not a number of CPUs: write a positive decimal such as 1 or 0.5, or leave it empty for no limit", Quote(s.JobCPUs))
		}
	}
	if s.JobMemory != "" {
		if n, err := units.RAMInBytes(s.JobMemory); err != nil || n < minJobMemory {
			p.Add("RTE_JOB_MEMORY", "%s is not a memory limit of at least 6m: write bytes with an optional unit, such as 512m or 2g, or leave it empty for no limit", Quote(s.JobMemory))
		}
	}
}

// ImagesAllowList is RTE_IMAGES_ALLOW split at commas, blanks dropped.
func (s *Settings) ImagesAllowList() []string {
	var out []string
	for _, v := range strings.Split(s.ImagesAllow, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// JobNanoCPUs is RTE_JOB_CPUS in billionths of a CPU, 0 for no limit.
func (s *Settings) JobNanoCPUs() int64 {
	n, err := strconv.ParseFloat(s.JobCPUs, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return int64(n * 1e9)
}

// JobMemoryBytes is RTE_JOB_MEMORY in bytes, 0 for no limit.
func (s *Settings) JobMemoryBytes() int64 {
	n, err := units.RAMInBytes(s.JobMemory)
	if err != nil || s.JobMemory == "" {
		return 0
	}
	return n
}
