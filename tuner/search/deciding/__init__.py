"""What is recommended: the final round, the decision and the profiles after it."""
