"""How a config is measured: the protocol, its statistics, the baselines, the time per phase,
the compile artefacts."""
