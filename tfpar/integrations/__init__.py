"""tfpar inside other engines' training loops (each integration imports its engine when used)."""
