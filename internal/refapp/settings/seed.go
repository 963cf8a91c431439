package settings

import (
	"errors"

	"github.com/rte-project/rte/internal/config"

	"github.com/rte-project/rte/app"
)

// loadedSeed is the config seed as checked when the settings were loaded, with the environment
// its ${VAR}s expand from: the one the settings came from, so a test's table works as the
// process's environment does.
type loadedSeed struct {
	seed *app.Seed
	vars map[string]string
}

func (l *loadedSeed) lookup(name string) (string, bool) {
	v, ok := l.vars[name]
	return v, ok
}

// checkNodeSettings checks the settings for several app nodes and the config seed: the secret
// key's length, and the seed file, read and checked at once so a bad seed stops the start with
// every problem listed beside the other settings'. A seed that passes is kept for serve, which
// applies it once the app is made.
func (s *Settings) checkNodeSettings(vars map[string]string, p *config.Problems) {
	switch key := string(s.SecretKey); {
	case key == "":
	case len(key) < app.MinSecretKeyLength:
		p.Add("APP_SECRET_KEY", "is %d characters; use at least %d, the same on every app node (openssl rand -hex 32)", len(key), app.MinSecretKeyLength)
	case !printableToken(key):
		p.Add("APP_SECRET_KEY", "holds spaces or control characters; use printable characters only (openssl rand -hex 32)")
	}
	if s.Seed == "" {
		return
	}
	l := &loadedSeed{vars: vars}
	seed, err := app.LoadSeed(s.Seed, l.lookup)
	var se *app.SeedError
	switch {
	case errors.As(err, &se):
		for _, problem := range se.Problems {
			p.Add("APP_SEED", "%s %s", s.Seed, problem)
		}
	case err != nil:
		p.Add("APP_SEED", "%v; give the YAML file of runners (docs/reference-app.md, The config seed), or leave APP_SEED unset", err)
	default:
		l.seed = seed
		s.seed = l
	}
}

// SeedSource is app.Config.Seed: it reads the seed file again each time, so the outbound
// endpoint sees a seed edited since the start. Nil without APP_SEED.
func (s *Settings) SeedSource() func() (*app.Seed, error) {
	if s.seed == nil {
		return nil
	}
	return func() (*app.Seed, error) { return app.LoadSeed(s.Seed, s.seed.lookup) }
}
