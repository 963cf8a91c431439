// Package deploy holds no code of the RTE: its tests run the deployment files that operators
// copy (the Dockerfile's images, compose/compose.yaml, deploy/systemd) for real, against the
// Docker engine and systemd-analyze of the machine. A test whose tool is missing is skipped
// with a message naming what it could not run; it never passes without having run.
//
// The files themselves live beside this package: Dockerfile at the repository's root,
// compose/, deploy/image (scripts built into the images), deploy/systemd.
package deploy
