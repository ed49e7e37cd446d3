"""What is searched: the search space and the named spaces."""
