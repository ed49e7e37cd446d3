"""Whether a config is correct: the gate, its child processes and its memo across studies."""
