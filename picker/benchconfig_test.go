package picker

func benchConfig() Config {
	c := DefaultConfig()
	var s []Plugin
	for _, p := range c.Scorers {
		if p.Name != "prefix" && p.Name != "latency" {
			s = append(s, p)
		}
	}
	c.Scorers = s
	return c
}
