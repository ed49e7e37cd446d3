"""The tuning service (FastAPI). Thin: translates HTTP to the tuner and back."""
