"""The tuning service: tables, job store, trial slots, GPU leases, settings, workers."""
