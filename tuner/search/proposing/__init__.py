"""Which config next: the first stage of corners, screening, predictions, the stopping rules."""
