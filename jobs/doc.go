// Package jobs runs playbooks: one ansible-playbook process group per job, its output and
// structured events batched into numbered records, capacity, cancel, timeouts, drain and
// sealed secrets (PROTOCOL.md sections 5, 7 and 8).
//
// A Manager owns every job it accepts and the goroutines that run them. For each job it makes a
// private directory (WorkDir/<job>, mode 0700), lets a Preparer put the playbooks and inventories
// in place, writes extravars and opened secrets to 0600 files there (a container engine hands
// the secrets to a tmpfs of the job's container instead: dockersecrets.go), and starts
// ansible-playbook in its own process group with an environment built only from Config.BaseEnv, the job's env,
// a few fixed Ansible settings and the af_events plugin wiring (package afevents). Stdout and
// stderr share one pipe, so their order is kept; events arrive on a second pipe, fd 3. Every
// record goes through Recorder.Append, in order: start first, end last, and nothing after end.
// Secret values are masked before a record is appended, so they never reach the spool.
//
// The job directory is removed when the job ends, whatever the end; nothing of a job's process
// group outlives the job.
//
// It refuses to: start a job twice (a repeated job.start is accepted and ignored while the job
// runs or has records in the Recorder; once the job ended and its records left the Recorder,
// it is refused already_ran for RanRetention, remembered across restarts in Config.RanLedger),
// make or remove a job directory that is not a strict child of WorkDir, take jobs while
// draining or while the Recorder reports itself unhealthy, let a job's env override the plugin
// wiring or set a guarded name (one that moves ansible's output, plugins or configuration, such
// as ANSIBLE_LOG_PATH or ANSIBLE_CONFIG) that the operator did not list in Config.EnvAllow,
// resolve a local path outside its root, or pass anything of the RTE's own environment to
// ansible beyond what the operator's RTE_JOB_ENV_ALLOW names (PassEnv; the RTE's tokens never).
// It knows nothing about sockets: the session reads records from the spool.
//
// A job's run has four parts. The runner (run.go) owns the job's directory and the order of its
// records. The engine (engine.go) is the only code that starts, signals and waits for a job's
// processes, behind one small interface: the process group (group.go, the default) starts
// ansible-playbook as a group leader, stops the group (SIGTERM, KillGrace, SIGKILL) and reaps
// the leader; the docker engine (docker.go, Config.Containers) runs it in a fresh container per
// job through the Docker Engine API, with only the job directory mounted, the same two streams
// through named pipes, and the container stopped (SIGTERM, KillGrace, SIGKILL) and removed.
// The same code drives Podman through its Docker-compatible API (ContainerConfig.Podman).
// It refuses to make a container for a playbook outside the job directory, and jobs while the
// engine does not answer or, under RTE_PULL=never, lacks the image (Ready). A job may name its
// image (protocol.JobStart.Image) only from ContainerConfig.Image and Allow
// (RTE_IMAGES_ALLOW); any other, or any image without a container engine, is refused
// invalid before anything starts. The batches (batch.go) turn the
// pipes into output and events records, the recording (record.go) hands records to the
// Recorder and stops the job when it fails, and end.go decides the end record from how the
// process ended and why it was stopped.
//
// The Manager assumes it is not PID 1 in its container, or that PID 1 reaps orphans: the
// workers of a killed ansible-playbook are reparented to PID 1, and a PID 1 that never waits
// for them collects zombies (run the RTE under tini, docker's --init, or compose's init: true).
package jobs
