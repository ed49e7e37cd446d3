"""One study in one process: options, space, measurement, parity, statistics, decision."""
