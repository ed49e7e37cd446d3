"""Where a study lives and what is stored on it: storage, attribute keys, counting, retries."""
